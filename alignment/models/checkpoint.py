"""Hugging Face checkpoint layout for our Paddle models: `config.json` + `model.safetensors` (or shards + index).

Parameter names are HF's; Linear weights are transposed on the way in and out (Paddle [in, out], HF [out, in]).
Loading is strict: a missing, unexpected or mis-shaped tensor is an error naming the tensor and the file.
"""
from __future__ import annotations

import contextlib
import json
import os
from typing import Dict, Iterable, Optional

import paddle
import paddle.nn as nn
from safetensors import SafetensorError, safe_open
from safetensors.paddle import save_file

from alignment.fileio import atomic_directory
from alignment.models import paddlenlp_checkpoint
from alignment.models.config import check_tensor_split
from alignment.models.lora import has_lora, load_adapter, save_adapter
from alignment.models.moe import experts_elsewhere, whole_experts
from alignment.models.tokenizer import copy_tokenizer_files
from alignment.models.weight_index import read_weight_map
from alignment.parallel import tensor_parallel as tp
from alignment.parallel.distributed import expert_parallel_degree, is_main_process, model_parallel_degree

WEIGHTS_NAME = "model.safetensors"
WEIGHTS_INDEX_NAME = "model.safetensors.index.json"
DEFAULT_MAX_SHARD_BYTES = 2 * 1024**3
IGNORED_ON_LOAD = ("rotary_emb.inv_freq",)  # buffers some HF versions store; we recompute them


def linear_weight_names(model: nn.Layer) -> set:
    return {f"{name}.weight" if name else "weight" for name, sub in model.named_sublayers(include_self=True)
            if isinstance(sub, tp.linear_layer_types())}


def hf_state_dict(model: nn.Layer) -> Dict[str, paddle.Tensor]:
    """Model parameters under HF names and orientation, whole (tensor-parallel slices gathered, and under expert
    parallelism every rank's experts: collectives that every rank of the group must call), contiguous, ready for
    safetensors."""
    linear = linear_weight_names(model)
    out = {}
    for name, tensor in model.state_dict().items():
        if getattr(tensor, "expert_parallel", False):
            continue  # whole_experts below gathers every rank's experts
        if tp.is_split(tensor):
            tensor = tp.full_tensor(tensor)
        out[name] = tensor.T.contiguous() if name in linear else tensor.contiguous()
    for name, tensor in whole_experts(model).items():  # experts are Linear layers (weights transposed)
        out[name] = tensor.T.contiguous() if tensor.ndim == 2 else tensor.contiguous()
    return out


def _weight_files(path: str) -> Iterable[str]:
    index = os.path.join(path, WEIGHTS_INDEX_NAME)
    if os.path.exists(index):
        weight_map = read_weight_map(index, ".safetensors")
        return [os.path.join(path, name) for name in sorted(set(weight_map.values()))]
    single = os.path.join(path, WEIGHTS_NAME)
    if not os.path.exists(single):
        raise FileNotFoundError(f"{path}: no {WEIGHTS_NAME} or {WEIGHTS_INDEX_NAME} (not an HF safetensors checkpoint)")
    return [single]


@contextlib.contextmanager
def _strided_views():
    """safetensors' paddle reader reinterprets raw bytes with view_dtype, which only has a strided kernel; the
    CPU default in alignment/cpu_env.py turns FLAGS_use_stride_kernel off, so turn it on while reading."""
    previous = paddle.get_flags(["FLAGS_use_stride_kernel"])
    paddle.set_flags({"FLAGS_use_stride_kernel": True})
    try:
        yield
    finally:
        paddle.set_flags(previous)


def read_safetensors(file: str) -> Dict[str, paddle.Tensor]:
    """Every tensor of one safetensors file; a damaged file is an error naming it."""
    try:
        with _strided_views(), safe_open(file, framework="paddle") as f:
            return {key: f.get_tensor(key) for key in f.keys()}
    except (SafetensorError, OSError, ValueError) as err:
        raise ValueError(f"{file}: cannot read safetensors file, truncated or corrupt? ({err})") from err


def load_hf_state_dict(path: str) -> Dict[str, tuple]:
    """{name: (tensor, file)} for every tensor in the checkpoint directory (a PaddleNLP-written one is read
    through paddlenlp_checkpoint: renamed and transposed into this layout)."""
    if paddlenlp_checkpoint.is_paddlenlp_checkpoint(path):
        return paddlenlp_checkpoint.load_state_dict(path, read_safetensors)
    tensors = {}
    for file in _weight_files(path):
        if not os.path.exists(file):
            raise FileNotFoundError(f"{file}: listed in {WEIGHTS_INDEX_NAME} but missing")
        tensors.update({key: (tensor, file) for key, tensor in read_safetensors(file).items()})
    return tensors


def load_weights(model: nn.Layer, path: str, strict: bool = True, ignore_missing: Iterable[str] = (),
                 ignore_unexpected: Iterable[str] = ()) -> list:
    """Copy an HF checkpoint into `model`; return the names left uninitialised (allowed by `ignore_missing`).

    `ignore_missing` / `ignore_unexpected` are name prefixes: e.g. a score model started from a causal LM
    has no `score.` head in the file and does not use its `lm_head.`.
    """
    loaded = load_hf_state_dict(path)
    linear = linear_weight_names(model)
    own = model.state_dict()
    if getattr(getattr(model, "config", None), "tie_word_embeddings", False):
        loaded.pop("lm_head.weight", None)
    skip, elsewhere = tuple(ignore_unexpected), experts_elsewhere(model)  # other ranks' experts (expert parallel)
    unexpected = sorted(k for k in loaded if k not in own and not k.endswith(IGNORED_ON_LOAD)
                        and not (skip and k.startswith(skip)) and k not in elsewhere)
    missing = sorted(k for k in own if k not in loaded)
    not_allowed = [k for k in missing if not any(k.startswith(prefix) for prefix in ignore_missing)]
    if strict and (unexpected or not_allowed):
        raise ValueError(
            f"{path}: checkpoint does not match the model config: missing tensors {not_allowed[:8]}"
            f"{' ...' if len(not_allowed) > 8 else ''}, unexpected tensors {unexpected[:8]}"
            f"{' ...' if len(unexpected) > 8 else ''}"
        )
    for name, param in own.items():
        if name not in loaded:
            continue
        tensor, file = loaded[name]
        if name in linear:
            tensor = tensor.T
        whole = tp.whole_shape(param)
        if list(tensor.shape) != whole:
            hf_shape = list(loaded[name][0].shape)
            raise ValueError(f"{file}: tensor {name} has shape {hf_shape}, the model config expects "
                             f"{whole[::-1] if name in linear else whole}")
        if tp.is_split(param):
            tensor = tp.local_slice(tensor, param)  # this rank's slice of the whole tensor
        param.set_value(tensor.astype(param.dtype))
    return missing


def save_weights(model: nn.Layer, path: str, max_shard_bytes: int = DEFAULT_MAX_SHARD_BYTES,
                 state: Optional[Dict[str, paddle.Tensor]] = None) -> None:
    """Write safetensors weights into the existing directory `path`, sharded with an index when large."""
    state = hf_state_dict(model) if state is None else state
    shards, current, size = [], {}, 0
    for name in sorted(state):
        nbytes = int(state[name].numel()) * state[name].element_size()
        if current and size + nbytes > max_shard_bytes:
            shards.append(current)
            current, size = {}, 0
        current[name] = state[name]
        size += nbytes
    shards.append(current)
    if len(shards) == 1:
        save_file(shards[0], os.path.join(path, WEIGHTS_NAME), metadata={"format": "pt"})
        return
    weight_map, total = {}, 0
    for i, shard in enumerate(shards):
        file = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        save_file(shard, os.path.join(path, file), metadata={"format": "pt"})
        for name, tensor in shard.items():
            weight_map[name] = file
            total += int(tensor.numel()) * tensor.element_size()
    with open(os.path.join(path, WEIGHTS_INDEX_NAME), "w", encoding="utf-8") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2, sort_keys=True)


class PretrainedMixin:
    """`from_pretrained(dir)` / `save_pretrained(dir)` for layers with a `config` having the same methods."""

    config_class = None
    load_allow_missing = ()  # name prefixes a checkpoint may lack (initialised instead)
    load_ignore_unexpected = ()  # name prefixes of checkpoint tensors this model does not use
    peft_task_type = "CAUSAL_LM"  # PEFT's task_type for LoRA adapters of this model

    @classmethod
    def from_pretrained(cls, path: str, dtype: str = "float32", **config_overrides):
        if not os.path.isdir(path):
            raise FileNotFoundError(f"{path}: model directory not found")
        config = cls.config_class.from_pretrained(path)
        config_overrides.setdefault("tensor_parallel_degree", model_parallel_degree())  # split under tp > 1
        config_overrides.setdefault("expert_parallel_degree", expert_parallel_degree())  # experts split (MoE)
        for key, value in config_overrides.items():
            if not hasattr(config, key):
                raise ValueError(f"{path}: unknown config override {key!r}")
            setattr(config, key, value)
        check_tensor_split(getattr(config, "tensor_parallel_degree", 1), config, os.path.join(path, "config.json"))
        model = cls(config)
        if dtype != "float32":
            model.to(dtype=dtype)
        model.initialised_on_load = load_weights(model, path, ignore_missing=cls.load_allow_missing,
                                                 ignore_unexpected=cls.load_ignore_unexpected)
        model.name_or_path = path
        model.eval()
        return model

    def save_extra_files(self, path: str) -> None:
        """Hook: write files beside the weights (inside the same atomic save)."""

    def load_extra_files(self, path: str) -> None:
        """Hook: read what save_extra_files wrote."""

    def load_checkpoint(self, path: str) -> None:
        """Restore this model in place from a directory its save_pretrained wrote (exact: every tensor required;
        a LoRA model reads its adapter)."""
        if has_lora(self):
            load_adapter(self, path)
        else:
            load_weights(self, path)
        self.load_extra_files(path)

    def save_pretrained(self, path: str, tokenizer_dir: Optional[str] = None,
                        max_shard_bytes: int = DEFAULT_MAX_SHARD_BYTES) -> None:
        """Write config + weights (+ tokenizer files copied from `tokenizer_dir`) atomically to `path`. A model
        with LoRA adapters writes only the adapters, in PEFT's layout (as peft's save_pretrained does).
        Under several processes every rank calls it and rank 0 writes; a tensor-parallel model's slices are
        gathered first, so the files are whole whatever the degree."""
        split = any(tp.is_split(p) or getattr(p, "expert_parallel", False) for p in self.parameters())
        if not is_main_process() and not split:
            return
        state = hf_state_dict(self) if split else None  # a collective: every rank of the group takes part
        if not is_main_process():
            return
        if has_lora(self):
            save_adapter(self, path, getattr(self, "name_or_path", None), self.peft_task_type, tokenizer_dir,
                         self.save_extra_files)
            return
        with atomic_directory(path) as tmp:
            self.config.save_pretrained(tmp)
            save_weights(self, tmp, max_shard_bytes, state)
            self.save_extra_files(tmp)
            if tokenizer_dir:
                copy_tokenizer_files(tokenizer_dir, tmp)
