"""Host offload of models and optimizer states between the phases of a PPO step (PaddleNLP's offload_level).

    freeze_model  the reference and reward models live in host memory except while scoring
    optimizer     AdamW moments of actor and critic live in host memory except during the update
    train_model   actor and critic weights live in host memory except while they generate, score or train

A tensor is moved by copying it to the other place and re-pointing the same tensor object at the copy, so
models and optimizers keep their parameter objects (and names) and nothing else has to know. On GPU the host
place is pinned memory; on a CPU-only build both places are host memory, the moves still happen (the test
checks the storage really changes and the values do not), they just free nothing.
"""
from __future__ import annotations

import contextlib
from typing import Iterable, List

import paddle

from alignment.parallel import sharded


def host_place():
    return paddle.CUDAPinnedPlace() if paddle.is_compiled_with_cuda() else paddle.CPUPlace()


def device_place():
    device = paddle.get_device()  # "cpu" or "gpu:N"
    return paddle.CUDAPlace(int(device.split(":")[1])) if device.startswith("gpu") else paddle.CPUPlace()


def _move(tensors: Iterable[paddle.Tensor], place) -> None:
    with paddle.no_grad():
        for tensor in tensors:
            if tensor is None or not tensor._is_initialized():
                continue
            moved = tensor._copy_to(place, False)
            tensor.value().get_tensor()._share_data_with(moved.value().get_tensor())


def model_tensors(model) -> List[paddle.Tensor]:
    """Parameters and buffers; under sharding stage 3 this rank's slice of each sliced parameter (the slice
    tensors are replaced as layers run: a phase takes them again at its end)."""
    params = [p.fw_storage if sharded.is_sliced(p) else p for p in model.parameters()]
    return [t for t in params if t is not None] + list(model.buffers())


def optimizer_tensors(optimizer) -> List[paddle.Tensor]:
    """AdamW's moments and beta powers (and master weights), also behind fleet's sharding optimizer (stage 1) and
    Paddle's GroupShardedOptimizerStage2 (stage 2; stage 3 keeps the AdamW itself, over the slices)."""
    inner = getattr(optimizer, "_inner_opt", None) or getattr(optimizer, "_optim", optimizer)
    tensors = [t for per_param in inner._accumulators.values() for t in per_param.values()]
    return tensors + list(getattr(inner, "_master_weights", {}).values())


class Offloader:
    """Moves the tensors of the enabled levels to host memory and back, phase by phase."""

    def __init__(self, levels: frozenset, frozen_models=(), trained_models=(), optimizers=()):
        self.levels = levels
        trained_ids = {id(m) for m in trained_models if m is not None}
        self.frozen = [m for m in _unique(frozen_models) if id(m) not in trained_ids]  # LoRA: reference = actor
        self.trained = _unique(trained_models)
        self.optimizers = [o for o in optimizers if o is not None]
        self.memory_log = {}

    def _eligible(self, models=(), optimizers=()) -> List[paddle.Tensor]:
        tensors = []
        for model in _unique(models):
            if ("freeze_model" in self.levels and any(model is m for m in self.frozen)) or \
                    ("train_model" in self.levels and any(model is m for m in self.trained)):
                tensors += model_tensors(model)
        if "optimizer" in self.levels:
            for optimizer in optimizers:
                tensors += optimizer_tensors(optimizer)
        return tensors

    def offload_all(self) -> None:
        _move(self._eligible(self.frozen + self.trained, self.optimizers), host_place())

    @contextlib.contextmanager
    def phase(self, name: str, models=(), optimizers=()):
        """Bring `models` / `optimizers` to the device for the phase, back to host after it (enabled levels only);
        on GPU, record allocated device memory before and after (memory/<phase>_before|after, in GiB)."""
        _move(self._eligible(models, optimizers) if self.levels else [], device_place())
        self._record(f"{name}_before")
        try:
            yield
        finally:
            self._record(f"{name}_after")
            _move(self._eligible(models, optimizers) if self.levels else [], host_place())

    def _record(self, key: str) -> None:
        if paddle.is_compiled_with_cuda():
            self.memory_log[f"memory/{key}"] = paddle.device.cuda.memory_allocated() / 2**30


def _unique(items) -> list:
    seen, out = set(), []
    for item in items:
        if item is not None and id(item) not in seen:
            seen.add(id(item))
            out.append(item)
    return out
