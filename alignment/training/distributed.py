"""Data parallelism under `python -m paddle.distributed.launch --nproc_per_node N ...` (gloo on CPU, NCCL on GPU).

Each rank trains on its own slice of every global batch; gradients are averaged with all_reduce after backward
(explicitly, so models can be called through any method, not only DataParallel's forward); rank 0 writes logs
and checkpoints. A plain `python ...` run is world size 1 and none of this does anything.
"""
from __future__ import annotations

import os
from typing import Dict, List

import paddle
import paddle.distributed as dist


def world_size() -> int:
    return int(os.environ.get("PADDLE_TRAINERS_NUM", "1"))


def rank() -> int:
    return int(os.environ.get("PADDLE_TRAINER_ID", "0"))


def is_main_process() -> bool:
    return rank() == 0


def init_distributed() -> None:
    if world_size() > 1 and not dist.is_initialized():
        dist.init_parallel_env()


def shard(indices, num_shards: int = None, index: int = None):
    """This rank's part of a global batch of indices (strided, so shards differ by at most one item)."""
    num_shards = world_size() if num_shards is None else num_shards
    index = rank() if index is None else index
    return indices[index::num_shards]


def average_gradients(parameters) -> None:
    """All-reduce every gradient and divide by the world size (no-op for one process)."""
    world = world_size()
    if world == 1:
        return
    with paddle.no_grad():
        for param in parameters:
            if param.grad is not None:
                dist.all_reduce(param.grad)
                param.grad.scale_(1.0 / world)


def mean_over_ranks(metrics: Dict[str, float]) -> Dict[str, float]:
    """Average scalar metrics over ranks (same keys on every rank)."""
    if world_size() == 1 or not metrics:
        return metrics
    keys = sorted(metrics)
    values = paddle.to_tensor([float(metrics[k]) for k in keys], dtype="float64")
    dist.all_reduce(values)
    return dict(zip(keys, (values / world_size()).numpy().tolist()))


def gather_lists(values: List) -> List:
    """Concatenate a Python list from every rank, in rank order."""
    if world_size() == 1:
        return list(values)
    gathered: List = []
    dist.all_gather_object(gathered, list(values))
    return [v for part in gathered for v in part]


def barrier() -> None:
    if world_size() > 1:
        dist.barrier()
