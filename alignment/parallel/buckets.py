"""Gradients reduced over the data ranks a few megabytes at a time instead of one collective per tensor.

A collective has a fixed cost (on gloo, a few dozen system calls and a wait until every rank of the group has
arrived), which dominates for the many small tensors of a model (norms, biases, small projections): a tiny LLaMA's
PPO step under tensor x data parallelism spent over a quarter of its collectives on per-tensor gradient all-reduces.
Buckets of consecutive tensors of one dtype, flattened into one buffer, reduced, and copied back, do the same
element-wise sums in a handful of calls (Paddle's DataParallel buckets its gradients the same way).
"""
from __future__ import annotations

from typing import Callable, List

import paddle

BUCKET_BYTES = 32 * 2 ** 20  # DataParallel's default comm_buffer_size is 25 MB; the copies stay small against a step


def buckets(tensors: List[paddle.Tensor], limit_bytes: int = BUCKET_BYTES) -> List[List[int]]:
    """Indices of `tensors`, in order, cut into runs of one dtype of at most limit_bytes (a tensor larger than
    the limit makes a run of its own)."""
    runs: List[List[int]] = []
    size = 0
    for i, tensor in enumerate(tensors):
        nbytes = int(tensor.size) * tensor.element_size()
        if not runs or tensor.dtype != tensors[runs[-1][-1]].dtype or size + nbytes > limit_bytes:
            runs.append([])
            size = 0
        runs[-1].append(i)
        size += nbytes
    return runs


def reduce_in_buckets(tensors: List[paddle.Tensor], reduce: Callable[[paddle.Tensor], None], scale: float,
                      limit_bytes: int = BUCKET_BYTES) -> None:
    """reduce(buffer) (an in-place collective) over every tensor, then multiply by `scale`, a bucket at a time;
    each tensor ends holding its own elements of the result, as if reduced and scaled alone."""
    with paddle.no_grad():
        for run in buckets(tensors, limit_bytes):
            alone = len(run) == 1  # reduced in place, no copies
            flat = tensors[run[0]] if alone else paddle.concat([tensors[i].reshape([-1]) for i in run])
            reduce(flat)
            flat.scale_(scale)
            if not alone:
                parts = paddle.split(flat, [int(tensors[i].size) for i in run])
                for i, part in zip(run, parts):
                    paddle.assign(part.reshape(tensors[i].shape), output=tensors[i])
