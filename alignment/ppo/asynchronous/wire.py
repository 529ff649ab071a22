"""Rollouts and policy weights as plain data, for asynchronous RL (asynchronous.py) and its checkpoints.

A rollout travels (and is checkpointed) as JSON text: every tensor field as {"dtype", "shape", "data"} (float32
values written as float64 numbers, which JSON reads back to the same float32 bits), the lists and labels as they
are. Nothing is unpickled: what a peer or a checkpoint sends can only ever become arrays and JSON values.
Weights travel as one flat float32 tensor of the trainable parameters in a fixed order, with a header tensor
[version, crc32 of the bytes, number of values] the receiver checks.
"""
from __future__ import annotations

import dataclasses
import json
import zlib
from typing import Dict, List, Tuple

import numpy as np
import paddle

from alignment.models.weights_digest import set_policy_version
from alignment.ppo.rollout.rollout import Rollout

DTYPES = ("float32", "int64", "int32", "bool")


def rollout_to_json(rollout: Rollout) -> str:
    """The rollout's fields as JSON text (tensors as arrays)."""
    fields = {}
    for f in dataclasses.fields(Rollout):
        value = getattr(rollout, f.name)
        if isinstance(value, paddle.Tensor):
            array = value.numpy()
            value = {"dtype": str(array.dtype), "shape": list(array.shape),
                     "data": array.astype("float64" if array.dtype.kind == "f" else array.dtype).ravel().tolist()}
        fields[f.name] = value
    return json.dumps(fields, ensure_ascii=False)


def rollout_from_json(text: str) -> Rollout:
    """rollout_to_json's text back to a Rollout; ValueError when it is not one."""
    try:
        fields = json.loads(text)
        names = {f.name for f in dataclasses.fields(Rollout)}
        if not isinstance(fields, dict) or set(fields) != names:
            raise ValueError(f"fields {sorted(fields) if isinstance(fields, dict) else type(fields).__name__}")
        for name, value in fields.items():
            if isinstance(value, dict) and set(value) == {"dtype", "shape", "data"}:
                if value["dtype"] not in DTYPES:
                    raise ValueError(f"{name}: dtype {value['dtype']!r}")
                array = np.asarray(value["data"], dtype=value["dtype"]).reshape(value["shape"])
                fields[name] = paddle.to_tensor(array)
        return Rollout(**fields)
    except (TypeError, KeyError, ValueError) as err:
        raise ValueError(f"not a rollout ({err})") from None


def sample_ids_from_json(text: str) -> List[str]:
    """The sample ids of rollout_to_json's text, without building its tensors (batches dropped unscored)."""
    try:
        return list(json.loads(text)["sample_ids"])
    except (TypeError, KeyError, ValueError) as err:
        raise ValueError(f"not a rollout ({err})") from None


def trainable(model) -> List[Tuple[str, paddle.Tensor]]:
    """The parameters an update changes (all of them, or LoRA's adapters and heads), in a fixed order."""
    return [(name, p) for name, p in model.named_parameters() if not p.stop_gradient]


def pack_weights(model, version: int) -> Tuple[paddle.Tensor, paddle.Tensor]:
    """(header int64 [3]: version, crc32, count; flat float32 [count]) of the trainable parameters."""
    flat = np.concatenate([p.numpy().astype("float32").ravel() for _, p in trainable(model)])
    crc = zlib.crc32(flat.tobytes())
    return paddle.to_tensor([version, crc, flat.size], dtype="int64"), paddle.to_tensor(flat)


def weight_count(model) -> int:
    return int(sum(int(np.prod(p.shape)) for _, p in trainable(model)))


def unpack_weights(model, header: paddle.Tensor, flat: paddle.Tensor) -> int:
    """Check the header's checksum and count against `flat`, copy the values into the model's trainable
    parameters; -> the version. ValueError naming the version when the bytes are not what was sent."""
    version, crc, count = (int(x) for x in header.numpy())
    values = flat.numpy()
    if values.size != count or zlib.crc32(values.tobytes()) != crc:
        raise ValueError(f"policy weights version {version}: checksum or size mismatch (received {values.size} "
                         f"values, expected {count}); the transfer is corrupt")
    start = 0
    with paddle.no_grad():
        for _, p in trainable(model):
            size = int(np.prod(p.shape))
            p.set_value(paddle.to_tensor(values[start: start + size].reshape(p.shape)).astype(p.dtype))
            start += size
    set_policy_version(model, version)  # caches built from the older weights are stale now (engine.py)
    return version


def flat_digest(model) -> Dict[str, int]:
    """crc32 and size of the trainable parameters (for logs and tests: two models hold the same version)."""
    flat = np.concatenate([p.numpy().astype("float32").ravel() for _, p in trainable(model)])
    return {"crc32": zlib.crc32(flat.tobytes()), "values": int(flat.size)}
