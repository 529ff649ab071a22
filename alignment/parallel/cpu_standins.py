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
"""
from __future__ import annotations

import inspect
import os

import paddle
import paddle.distributed as dist
from paddle.autograd import PyLayer
from paddle.distributed.fleet.layers.mpu import mp_ops
from paddle.distributed import collective
from paddle.distributed.parallel import ParallelEnv

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
