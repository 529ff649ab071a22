"""What sharding stage 3 (Paddle's GroupShardedStage3) leaves of a parameter on each rank, and its whole value.

Stage 3 flattens each parameter with more than `segment_size` elements, pads it (to the device's alignment and a
multiple of the sharding degree) and keeps rank r's contiguous part [r m, (r + 1) m) in `param.fw_storage`
(m elements); the parameter itself holds no data (`param.status == "part"`) except while a layer that owns it runs
forward or backward, when the layer's hooks gather it. Smaller parameters stay whole on every rank. The optimizer
sees each slice as a parameter named "slice@<name>", so its AdamW moments are slices too ([m]).

Saving, loading, whole copies for generation and the NaN check read and write the whole values through these
functions (collectives over the sharding group: every rank calls them, in the same order).
"""
from __future__ import annotations

import contextlib
from typing import Iterable

import paddle
import paddle.distributed as dist

from alignment.parallel.distributed import hybrid_group

SLICE_PREFIX = "slice@"  # Paddle's name for a parameter's slice (group_sharded_stage3._TensorWrapper)


def is_sliced(param) -> bool:
    """Whether stage 3 keeps only a slice of `param` on each rank (larger than its segment size; Paddle marks such
    parameters with a `status`, "part" or, while gathered, "all")."""
    return hasattr(param, "status")


def _group():
    return hybrid_group().get_sharding_parallel_group()


def gather_flat(local: paddle.Tensor, numel: int, shape) -> paddle.Tensor:
    """The sharding ranks' slices [m] of one flattened, padded tensor, joined, unpadded and shaped `shape`."""
    parts = []
    dist.all_gather(parts, local.detach().reshape([-1]), group=_group())
    return paddle.concat(parts)[:numel].reshape(list(shape))


def local_flat(whole: paddle.Tensor, slice_numel: int) -> paddle.Tensor:
    """This rank's slice [m] of `whole` flattened and zero-padded to m x the sharding degree."""
    group = _group()
    flat = whole.reshape([-1])
    padding = slice_numel * group.nranks - flat.shape[0]
    if padding:
        flat = paddle.concat([flat, paddle.zeros([padding], dtype=flat.dtype)])
    return flat[group.rank * slice_numel:(group.rank + 1) * slice_numel].clone()


def whole_value(param) -> paddle.Tensor:
    """`param`'s whole value on this rank (gathered from the slices when stage 3 slices it and it is not gathered
    now; a collective then)."""
    if getattr(param, "status", None) != "part":
        return param
    return gather_flat(param.fw_storage, param._numel(), param.shape)


@contextlib.contextmanager
def whole_parameters(params: Iterable):
    """Inside the block every sliced parameter of `params` holds its whole value (a checkpoint can be written from
    it or loaded into it); after it, each rank's slice is taken from the values then held and the parameters are
    released again. A collective."""
    released = [p for p in params if getattr(p, "status", None) == "part"]
    with paddle.no_grad():
        for param in released:
            whole = gather_flat(param.fw_storage, param._numel(), param.shape)
            whole._share_buffer_to(param)
        try:
            yield
        finally:
            for param in released:
                paddle.assign(local_flat(param, param.fw_storage._numel()), output=param.fw_storage)
                param._clear_data()
