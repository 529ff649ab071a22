"""The digest of the weights a model samples with: sha256 over every parameter the forward pass uses (name, dtype,
shape and bytes, in `named_parameters` order). A LoRA layer whose adapter is switched off (`adapters_disabled`)
contributes its base weight only, so a sampler that runs without its adapter has the base model's digest.

Computed once per weight sync by each sampler (the local engine at each step, a rollout rank when it loads a
version) and by the trainer for each policy version (ppo/asynchronous/weight_check.py); never cached across a change of
weights. The bytes are read in place (dlpack), not copied: on the 2-core CPU a SmolLM2-135M digest (540 MB of
float32) took about 0.45 s, against a 42 s PPO step.

`policy_version` is the version a model's weights are (set by whoever loads or trains them: wire.unpack_weights,
the trainer at each step's start); the decode engine keys its KV cache and weight copy by it (engine.py).
"""
from __future__ import annotations

import hashlib
from typing import Optional

import numpy as np

from alignment.models.lora import adapters_disabled, has_lora, lora_layers

VERSION_ATTRIBUTE = "policy_version"


class StaleWeights(ValueError):
    """Samples or caches of other weights than the ones claimed: one line, exit 2 (alignment/exits.py)."""


def _bytes(param) -> memoryview:
    """The parameter's values as bytes, read in place for float32 (dlpack) and copied otherwise."""
    tensor = param.detach()
    in_place = str(tensor.dtype).endswith("float32") and tensor.place.is_cpu_place()
    array = np.from_dlpack(tensor) if in_place else tensor.numpy()
    return memoryview(np.ascontiguousarray(array)).cast("B")


def weights_digest(model) -> str:
    """sha256 hex digest of the weights `model` samples with now (adapters as they are switched)."""
    unused = {f"{name}.{part}" for name, layer in lora_layers(model).items() if not layer.enabled
              for part in ("lora_A", "lora_B")}
    digest = hashlib.sha256()
    for name, param in model.named_parameters():
        if name in unused:
            continue
        digest.update(f"{name}:{param.dtype}:{list(param.shape)};".encode())
        digest.update(_bytes(param))
    return digest.hexdigest()


def base_digest(model) -> Optional[str]:
    """The digest of `model` with every LoRA adapter off (what a sampler that never applied them holds), or None
    for a model without adapters."""
    if not has_lora(model):
        return None
    with adapters_disabled(model):
        return weights_digest(model)


def set_policy_version(model, version: int) -> None:
    """Mark `model`'s weights as policy version `version` (the key of every cache built from them)."""
    setattr(model, VERSION_ATTRIBUTE, int(version))


def policy_version(model) -> Optional[int]:
    """The version set_policy_version marked, None for a model no one marked (a frozen one, a served one)."""
    return getattr(model, VERSION_ATTRIBUTE, None)
