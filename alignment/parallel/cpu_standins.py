"""Stand-ins for the collective kernels Paddle 3.3.1's CPU build lacks, so tensor- and pipeline-parallel runs work
on CPU with the gloo backend (tests, laptops). Loaded only on CPU (`install()` is called by
alignment/parallel/distributed.py before fleet.init when Paddle has no CUDA); GPU runs use Paddle's own kernels.

Each piece replaces one function of `paddle.distributed.fleet.layers.mpu.mp_ops` (fleet's tensor-parallel
layers call them through that module) or of the pipeline's p2p helper, and is written with Paddle-level
collectives (`paddle.distributed.all_reduce` / `all_gather` / `send` / `recv`) that gloo has:

    _c_identity                    c_identity kernel + all_reduce_on_calc_stream (gloo: no calc-stream collectives)
    _mp_allreduce                  mp_allreduce_sum / all_reduce_on_calc_stream
    _c_concat                      c_concat kernel (all-gather along the last axis)
    _c_split                       c_split kernel (this rank's slice of the last axis)
    _c_softmax_with_cross_entropy  c_softmax_with_cross_entropy kernel (vocab-parallel cross-entropy)
    ParallelEnv.device_id          set only from FLAGS_selected_gpus/xpus; a CPU build has none, and
                                   PipelineLayer reads it (0 here)
    collective._new_process_group_impl   (gloo groups only) the same call with a private TCPStore per group:
                                   Paddle's ProcessGroupGloo rendezvous writes its peers' addresses under the bare
                                   keys "0".."n-1" of the one global store and never deletes them, so groups created
                                   back to back (fleet.init's tensor / pipeline / sharding / data groups on 4+
                                   processes) read each other's addresses and fail with TIMEOUT / connection refused.
                                   Each group's rank 0 now hosts an empty store for it, announced through the global
                                   store under a key unique to the group.

Pipeline stages exchange activations with isend/irecv on CPU (`use_batch_p2p_comm` false in
parallel/distributed.py, a fleet setting), since gloo has no batched calc-stream p2p.

Sharding stages 2 and 3 (training/sharding.py) run Paddle's own group-sharded classes. Their collectives are
broadcast, reduce, all_reduce and all_gather, which gloo has (no reduce_scatter or alltoall, the two gloo lacks);
what stops them on CPU is three device checks and one copy, found by running them there. `group_sharded_parallel`
below is picked instead of Paddle's on a CPU build only; it builds Paddle's classes through these stand-ins:

    group_sharded_parallel         paddle.distributed.sharding.group_sharded_parallel asserts paddle.get_device() is
                                   gpu / xpu / a custom device ("group_sharded_parallel only support gpu, xpu and
                                   custom_device now"); this one builds the same wrappers with device "cpu"
    GroupShardedOptimizerStage2    __init__ asserts core.is_compiled_with_cuda() (or XPU, or a custom device: "Only
                                   GPU and XPU and CustomDevice is supported now") and parses a device number out of
                                   paddle.get_device() ("gpu:0"; "cpu" has none: IndexError). Paddle's own __init__
                                   runs with `core` answering the first and `paddle.get_device()` saying "cpu:0"
                                   (`_HostBuild`, `_HostPaddle`)
    ParamStorage.add_rank_params   (from GroupShardedOptimizerStage2._integration_params) builds each rank's fused
                                   parameter buffer in host memory, then copies it to the device with cvt_to_device,
                                   which fails on a CPU build (CPUPlace has no get_device_type, before its own
                                   OSError "Only supported compiled paddle with gpu/rocm and xpu"); here the buffer
                                   stays where it was built (convert_gpu=False)
    GroupShardedStage3             __init__ asserts core.is_compiled_with_cuda() (or XPU, or a custom device: "Only
                                   support CUDA / XPU / CustomDevice."); Paddle's own __init__ runs with `core`
                                   answering it. The module-level names __init__ sets (DEV "cpu", DEV_ID 0,
                                   param2dtype) then live in the stand-in's copy of the module namespace, and so do
                                   the two methods __init__ calls that record param2dtype (_flatten_layer_params,
                                   _handle_unslice_params); Paddle reads them again only for offload, refused on CPU

Expert parallelism (alignment/parallel/expert_parallel.py) exchanges rows all-to-all, which gloo lacks
("ProcessGroupGLOO does not support all_to_all"); on a CPU build it calls this module's function instead of
Paddle's (nothing of Paddle's is replaced):

    alltoall_single                paddle.distributed.alltoall_single with split sizes: every rank's split sizes
                                   and rows (padded to the longest) all-gathered, then the rows addressed to this
                                   rank taken from each (P times the traffic of an all-to-all; CPU tests only)

"Runs with": the stand-in is a new function object over Paddle's own code with a copy of its module's namespace
in which the names above are replaced (`_paddle_code`); Paddle's modules and classes are not changed. Offload
(Paddle's `offload=True`) is not stood in for: stage 2's asserts float16 parameters (no CPU matmul kernel) and
stage 3's copies slices to "cpu:0", which paddle does not parse.
"""
from __future__ import annotations

import inspect
import os
import types

import numpy as np
import paddle
import paddle.distributed as dist
from paddle.autograd import PyLayer
from paddle.distributed.fleet.layers.mpu import mp_ops
from paddle.distributed import collective
from paddle.distributed.fleet.meta_parallel.sharding import group_sharded_optimizer_stage2 as stage2_optimizer
from paddle.distributed.fleet.meta_parallel.sharding import group_sharded_stage3 as stage3
from paddle.distributed.fleet.meta_parallel.sharding import group_sharded_storage as storage
from paddle.distributed.fleet.meta_parallel.sharding.group_sharded_stage2 import GroupShardedStage2
from paddle.distributed.parallel import ParallelEnv
from paddle.framework import core

from alignment.parallel.stores import rank_zero_store

_installed = False
_group_stores = []  # the private rendezvous stores must live as long as their groups


def _all_reduce_sum(tensor, group):
    out = tensor.clone()
    dist.all_reduce(out, op=dist.ReduceOp.SUM, group=group)
    return out


def _gather_last_axis(tensor, group):
    parts = []
    dist.all_gather(parts, tensor.contiguous(), group=group)
    return paddle.concat(parts, axis=-1)


def _slice_last_axis(tensor, group):
    width = tensor.shape[-1] // group.nranks
    return tensor[..., group.rank * width:(group.rank + 1) * width].contiguous()


def _collective_layer(name: str, forward, backward, doc: str) -> type:
    """A PyLayer computing `forward(tensor, group)` and, for the gradient, `backward(grad, group)`."""

    class CollectiveLayer(PyLayer):
        @staticmethod
        def forward(ctx, tensor, group):
            ctx.group = group
            return forward(tensor, group)

        @staticmethod
        def backward(ctx, grad):
            return backward(grad, ctx.group)

    CollectiveLayer.__doc__ = doc
    CollectiveLayer.__name__ = CollectiveLayer.__qualname__ = name
    return CollectiveLayer


def _unchanged(tensor, group):
    return tensor


_Identity = _collective_layer("_Identity", lambda tensor, group: tensor.clone(), _all_reduce_sum,
                              "Forward: identity. Backward: sum the gradient over the model-parallel group "
                              "(c_identity).")
_AllReduce = _collective_layer("_AllReduce", _all_reduce_sum, _unchanged,
                               "Forward: sum over the group. Backward: identity (mp_allreduce_sum).")
_Concat = _collective_layer("_Concat", _gather_last_axis, _slice_last_axis,
                            "Forward: all-gather along the last axis. Backward: this rank's slice (c_concat).")
_Split = _collective_layer("_Split", _slice_last_axis, _gather_last_axis,
                           "Forward: this rank's slice of the last axis. Backward: all-gather (c_split).")


class _ParallelCrossEntropy(PyLayer):
    """Cross-entropy over vocab-parallel logits (c_softmax_with_cross_entropy): logits [..., V/n] on each rank,
    label [..., 1] global ids; loss [..., 1]. Rows whose label is ignore_index get loss 0 and no gradient."""

    @staticmethod
    def forward(ctx, logits, label, group, ignore_index):
        logits = logits.astype("float32")
        width = logits.shape[-1]
        start = group.rank * width
        row_max = logits.max(axis=-1, keepdim=True)
        dist.all_reduce(row_max, op=dist.ReduceOp.MAX, group=group)
        shifted = logits - row_max
        exp = paddle.exp(shifted)
        total = exp.sum(axis=-1, keepdim=True)
        dist.all_reduce(total, op=dist.ReduceOp.SUM, group=group)
        local = label - start
        mine = (local >= 0) & (local < width)
        onehot = paddle.nn.functional.one_hot(paddle.where(mine, local, paddle.zeros_like(local)).squeeze(-1),
                                              width) * mine.astype("float32")
        target = (shifted * onehot).sum(axis=-1, keepdim=True)
        dist.all_reduce(target, op=dist.ReduceOp.SUM, group=group)
        keep = (label != ignore_index).astype("float32")
        ctx.save_for_backward(exp / total, onehot, keep)
        return (paddle.log(total) - target) * keep

    @staticmethod
    def backward(ctx, grad):
        softmax, onehot, keep = ctx.saved_tensor()
        return (softmax - onehot) * (grad * keep)


def _c_identity(tensor, group=None, skip_c_identity_dynamic=False):
    return tensor if skip_c_identity_dynamic else _Identity.apply(tensor, group)


def _mp_allreduce(tensor, op=None, group=None, use_calc_stream=True, use_model_parallel=True,
                  skip_c_identity_dynamic=False):
    return _AllReduce.apply(tensor, group)


def _c_concat(tensor, group=None):
    return _Concat.apply(tensor, group)


def _c_split(tensor, group=None):
    return _Split.apply(tensor, group)


def _c_softmax_with_cross_entropy(logits, label, group=None, return_softmax=False, ignore_index=-100):
    if label.ndim == logits.ndim - 1:
        label = label.unsqueeze(-1)
    return _ParallelCrossEntropy.apply(logits, label, group, ignore_index)


def alltoall_single(out_tensor, in_tensor, in_split_sizes, out_split_sizes, group):
    """paddle.distributed.alltoall_single's meaning over gloo: in_tensor's rows, split over the ranks by
    in_split_sizes, sent; out_tensor gets the rows every rank sent here, in rank order (out_split_sizes)."""
    sizes = []
    dist.all_gather(sizes, paddle.to_tensor(list(in_split_sizes), "int64"), group=group)
    splits = np.stack([size.numpy() for size in sizes])  # [source, destination] rows
    longest, rows = int(splits.sum(axis=1).max()), in_tensor.shape[0]
    padded = in_tensor if rows == longest else paddle.concat(
        [in_tensor, paddle.zeros([longest - rows] + list(in_tensor.shape[1:]), in_tensor.dtype)])
    parts = []
    dist.all_gather(parts, padded.contiguous(), group=group)
    mine = rows_sent_to(parts, splits, group.rank)
    if list(splits[:, group.rank]) != list(out_split_sizes):
        raise ValueError(f"alltoall_single: rank {group.rank} expects {list(out_split_sizes)} rows from the ranks, "
                         f"they send {splits[:, group.rank].tolist()}")
    paddle.assign(mine, output=out_tensor)


def rows_sent_to(parts, splits, me: int):
    """From each source rank i's rows parts[i], the ones it addresses to rank `me` (splits [source, destination]:
    rank i's rows go to ranks 0, 1, ... in turn), concatenated in rank order."""
    starts = np.cumsum(splits, axis=1) - splits
    return paddle.concat([parts[i][int(starts[i, me]):int(starts[i, me] + splits[i, me])] for i in range(len(parts))])


def _private_store(group_rank: int, group_id: int, group_name: str):
    """A TCPStore of this group alone: hosted by its rank 0 on a free port of its own address, found by the
    others under a key of the global store unique to the group."""
    host = (os.getenv("PADDLE_CURRENT_ENDPOINT") or "127.0.0.1:0").rsplit(":", 1)[0]
    store = rank_zero_store(group_rank, f"/alignment/gloo_group_store/{group_id}/{group_name}", host,
                            collective._default_store, int(os.getenv("FLAGS_stop_check_timeout", "900")))
    _group_stores.append(store)
    return store


def _with_private_gloo_store(new_process_group_impl):
    signature = inspect.signature(new_process_group_impl)

    def new_group_impl(*args, **kwargs):
        bound = signature.bind(*args, **kwargs)
        bound.apply_defaults()
        a = bound.arguments
        if a["backend"] == "gloo" and a["world_size"] > 1:
            a["store"] = _private_store(a["rank"], a["group_id"], a["group_name"])
        return new_process_group_impl(*bound.args, **bound.kwargs)

    return new_group_impl


def install() -> None:
    """Put the stand-ins in place (idempotent), before fleet.init creates its groups. CPU only: never call it on
    a GPU build."""
    global _installed
    if _installed:
        return
    collective._new_process_group_impl = _with_private_gloo_store(collective._new_process_group_impl)
    mp_ops._c_identity = _c_identity
    mp_ops._mp_allreduce = _mp_allreduce
    mp_ops._c_concat = _c_concat
    mp_ops._c_split = _c_split
    mp_ops._c_softmax_with_cross_entropy = _c_softmax_with_cross_entropy
    ParallelEnv.device_id = property(lambda self: getattr(self, "_device_id", 0))
    _installed = True


class _HostBuild:
    """`paddle.framework.core` as the group-sharded constructors see it here: their device assertion holds (the host
    is the device on a CPU build); every other name is core's own."""

    def __getattr__(self, name):
        return getattr(core, name)

    @staticmethod
    def is_compiled_with_cuda() -> bool:
        return True


class _HostPaddle:
    """`paddle` as GroupShardedOptimizerStage2.__init__ sees it here: get_device() names device number 0."""

    def __getattr__(self, name):
        return getattr(paddle, name)

    @staticmethod
    def get_device() -> str:
        return "cpu:0"


def _paddle_code(function, namespace: dict):
    """Paddle's `function` (the same code object, defaults and closure) reading its module-level names from
    `namespace`."""
    return types.FunctionType(function.__code__, namespace, function.__name__, function.__defaults__,
                              function.__closure__)


class _HostParamStorage(storage.ParamStorage):
    def add_rank_params(self, trainable_params, param2align, convert_gpu=True):
        super().add_rank_params(trainable_params, param2align, convert_gpu=False)


_OPTIMIZER_NAMES = {**vars(stage2_optimizer), "core": _HostBuild(), "paddle": _HostPaddle(),
                    "ParamStorage": _HostParamStorage}


class _HostGroupShardedOptimizerStage2(stage2_optimizer.GroupShardedOptimizerStage2):
    __init__ = _paddle_code(stage2_optimizer.GroupShardedOptimizerStage2.__init__, _OPTIMIZER_NAMES)
    _integration_params = _paddle_code(stage2_optimizer.GroupShardedOptimizerStage2._integration_params,
                                       _OPTIMIZER_NAMES)


_STAGE3_NAMES = {**vars(stage3), "core": _HostBuild()}


class _HostGroupShardedStage3(stage3.GroupShardedStage3):
    __init__ = _paddle_code(stage3.GroupShardedStage3.__init__, _STAGE3_NAMES)
    _flatten_layer_params = _paddle_code(stage3.GroupShardedStage3._flatten_layer_params, _STAGE3_NAMES)
    _handle_unslice_params = _paddle_code(stage3.GroupShardedStage3._handle_unslice_params, _STAGE3_NAMES)


def group_sharded_parallel(model, optimizer, level, scaler=None, group=None, offload=False, sync_buffers=False,
                           buffer_max_size=2**23, segment_size=2**20, sync_comm=False, dp_group=None,
                           exclude_layer=None):
    """paddle.distributed.sharding.group_sharded_parallel's signature and wrappers ('os_g': GroupShardedStage2 over
    GroupShardedOptimizerStage2; 'p_g_os': GroupShardedStage3), built on the host. No scaler or offload here."""
    if scaler is not None or offload:
        raise ValueError("the CPU stand-in of group_sharded_parallel takes no GradScaler and no offload")
    if level == "os_g":
        optimizer = _HostGroupShardedOptimizerStage2(params=optimizer._parameter_list, optim=optimizer, group=group,
                                                     dp_group=dp_group, device="cpu")
        model = GroupShardedStage2(model, optimizer, group=group, sync_buffers=sync_buffers,
                                   buffer_max_size=buffer_max_size, dp_group=dp_group, device="cpu")
    elif level == "p_g_os":
        model = _HostGroupShardedStage3(model, optimizer=optimizer, group=group, sync_buffers=sync_buffers,
                                        segment_size=segment_size, sync_comm=sync_comm, dp_group=dp_group,
                                        device="cpu", exclude_layer=exclude_layer)
    else:
        raise ValueError(f"level {level!r}: the CPU stand-in builds 'os_g' and 'p_g_os'")
    return model, optimizer, scaler
