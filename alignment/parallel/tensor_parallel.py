"""Tensor-parallel building blocks (Megatron layout) on fleet's layers, and the slicing/merging of checkpoints.

    q/k/v, gate/up   ColumnParallelLinear  (output features split: each rank holds whole attention heads)
    o, down          RowParallelLinear     (input features split; outputs summed over the group)
    embed_tokens     VocabParallelEmbedding (vocabulary split)
    lm_head          ColumnParallelLinear over the vocabulary; logits stay split for the parallel cross-entropy
    MoE experts      SlicedLinear: split as gate/up and down, no collective of their own; the expert block sums
                     its experts' partial outputs over the group once (alignment/models/moe.py)

With degree 1 every builder returns the plain Paddle layer, so a one-process model has no fleet code in it.
Split parameters carry fleet's `is_distributed` / `split_axis` attributes; checkpoints are always whole (HF
layout): loading takes this rank's slice, saving gathers the slices (every rank of the group must call it).
"""
from __future__ import annotations

import paddle
import paddle.distributed as dist
import paddle.nn as nn


def _hcg():
    from paddle.distributed import fleet

    return fleet.get_hybrid_communicate_group()


def model_parallel_group():
    return _hcg().get_model_parallel_group()


def gradient_summed_over_group(tensor, degree: int):
    """`tensor` unchanged, its gradient summed over the model-parallel group: for a replicated weight each rank
    applies to its own part only (Qwen3's q/k norms over this rank's heads), so each rank's gradient is a part of
    the whole. fleet's c_identity, as ColumnParallelLinear applies it to its input (cpu_standins.py on CPU)."""
    if degree == 1:
        return tensor
    from paddle.distributed.fleet.layers.mpu import mp_ops

    return mp_ops._c_identity(tensor, group=model_parallel_group())


class Linear(nn.Linear):
    """nn.Linear that calls paddle.matmul directly when it has no bias: the functional linear's per-call flag
    lookups cost ~4 us of a 13 us call at decode shapes on CPU (measured), 29 times per decode step for a 4-layer
    LLaMA. Same parameters (`weight` [in, out], `bias`), same results; with a bias it is nn.Linear unchanged."""

    def forward(self, x):
        return paddle.matmul(x, self.weight) if self.bias is None else super().forward(x)


def summed_over_group(tensor, degree: int):
    """The element-wise sum of `tensor` over the model-parallel group, its gradient passed to every rank unchanged:
    fleet's mp_allreduce, as RowParallelLinear sums its partial outputs (an MoE block sums its experts' slices
    once, cpu_standins.py on CPU)."""
    if degree == 1:
        return tensor
    from paddle.distributed.fleet.layers.mpu import mp_ops

    return mp_ops._mp_allreduce(tensor, group=model_parallel_group(), use_calc_stream=True, use_model_parallel=True)


class SlicedLinear(Linear):
    """This rank's slice of a whole Linear [in, out] along `axis` (1: its output features, as ColumnParallelLinear
    holds them; 0: its input features, as RowParallelLinear), with no collective of its own: the caller sums the
    gradient of the input over the group (gradient_summed_over_group) and the partial outputs of an input slice
    (summed_over_group), once for many such layers (an MoE block's experts). An input slice leaves its bias
    (replicated) to the caller, to add once after that sum (`deferred_bias`)."""

    def __init__(self, in_features: int, out_features: int, bias: bool, axis: int, degree: int):
        shape = [in_features, out_features]
        if shape[axis] % degree:
            raise ValueError(f"a Linear of {shape[axis]} features does not split over tensor_parallel_degree "
                             f"{degree} (key 'tensor_parallel_degree')")
        shape[axis] //= degree
        super().__init__(shape[0], shape[1], bias_attr=None if bias else False)
        self.axis = axis
        self.weight.is_distributed, self.weight.split_axis = True, axis
        if self.bias is not None and axis == 1:
            self.bias.is_distributed, self.bias.split_axis = True, 0

    @property
    def deferred_bias(self):
        """The bias the caller adds after the sum (an input slice's; None for an output slice or no bias)."""
        return self.bias if self.axis == 0 else None

    def forward(self, x):
        return paddle.matmul(x, self.weight) if self.axis == 0 else super().forward(x)


def sliced_linear(in_features: int, out_features: int, bias: bool, axis: int, degree: int) -> nn.Layer:
    """SlicedLinear, or the plain Linear for degree 1."""
    if degree == 1:
        return Linear(in_features, out_features, bias_attr=None if bias else False)
    return SlicedLinear(in_features, out_features, bias, axis, degree)


def column_linear(in_features: int, out_features: int, bias: bool, degree: int) -> nn.Layer:
    if degree == 1:
        return Linear(in_features, out_features, bias_attr=None if bias else False)
    from paddle.distributed.fleet.meta_parallel import ColumnParallelLinear

    return ColumnParallelLinear(in_features, out_features, has_bias=bias, gather_output=False)


def row_linear(in_features: int, out_features: int, bias: bool, degree: int) -> nn.Layer:
    if degree == 1:
        return Linear(in_features, out_features, bias_attr=None if bias else False)
    from paddle.distributed.fleet.meta_parallel import RowParallelLinear

    return RowParallelLinear(in_features, out_features, has_bias=bias, input_is_parallel=True)


def embedding(vocab_size: int, hidden_size: int, degree: int) -> nn.Layer:
    if degree == 1:
        return nn.Embedding(vocab_size, hidden_size)
    from paddle.distributed.fleet.meta_parallel import VocabParallelEmbedding

    return VocabParallelEmbedding(vocab_size, hidden_size)


def is_split(param) -> bool:
    return bool(getattr(param, "is_distributed", False)) and hasattr(param, "split_axis")


def linear_layer_types() -> tuple:
    """Layers whose weight is stored [in, out] in Paddle and [out, in] in HF checkpoints."""
    from paddle.distributed.fleet.meta_parallel import ColumnParallelLinear, RowParallelLinear

    return nn.Linear, ColumnParallelLinear, RowParallelLinear


def local_slice(full: paddle.Tensor, param) -> paddle.Tensor:
    """This rank's part of a whole tensor (Paddle orientation) for a split parameter."""
    group = model_parallel_group()
    axis, width = param.split_axis, full.shape[param.split_axis] // group.nranks
    return paddle.slice(full, [axis], [group.rank * width], [(group.rank + 1) * width])


def full_tensor(param) -> paddle.Tensor:
    """The whole tensor of a split parameter, gathered from the tensor-parallel group (a collective)."""
    return gather_along(param, param.split_axis)


def gather_along(tensor, axis: int) -> paddle.Tensor:
    """The tensor-parallel group's slices of a tensor, concatenated along `axis` (a collective)."""
    parts = []
    dist.all_gather(parts, tensor.detach().contiguous(), group=model_parallel_group())
    return paddle.concat(parts, axis=axis)


def whole_shape(param) -> list:
    shape = list(param.shape)
    if is_split(param):
        shape[param.split_axis] *= model_parallel_group().nranks
    return shape


def vocab_logits(hidden, weight_t: paddle.Tensor = None, lm_head: nn.Layer = None):
    """Logits over this rank's vocabulary slice [..., V/n]: from the tied embedding table [V/n, h] or the
    column-parallel head. The identity-forward / all-reduce-backward keeps the hidden state's gradient whole."""
    if lm_head is not None:
        return lm_head(hidden)
    from paddle.distributed.fleet.layers.mpu import mp_ops

    hidden = mp_ops._c_identity(hidden, group=model_parallel_group())
    return paddle.matmul(hidden, weight_t, transpose_y=True)


def gather_vocab(local_logits):
    """[..., V/n] on each rank -> [..., V] on every rank."""
    from paddle.distributed.fleet.layers.mpu import mp_ops

    return mp_ops._c_concat(local_logits, group=model_parallel_group())


def parallel_token_log_probs(local_logits, labels):
    """log p(label) [...] from vocab-split logits [..., V/n] and whole-vocabulary labels [...] (fleet's
    ParallelCrossEntropy: only maxima, sums and the target logit cross ranks, never the whole vocabulary)."""
    from paddle.distributed.fleet.meta_parallel import ParallelCrossEntropy

    return -ParallelCrossEntropy()(local_logits.astype("float32"), labels.unsqueeze(-1)).squeeze(-1)
