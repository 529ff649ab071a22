"""Eager decode steps of a LlamaForCausalLM over weights concatenated once per generation: the same numbers as
the model's own layers with a KV cache, in fewer calls.

A decode step of the layer path issues ~50 Paddle calls and 12 `nn.Layer` calls per decoder layer; here one
function per layer issues 36: q, k and v come from one GEMM over [q_proj | k_proj | v_proj] (MKL computes each
output column as the same dot product whatever the other columns: bit-identical, checked in
tests/models/test_fused_decode.py), RoPE rotates q, k and v in one pass with cos 1 and sin 0 for v (v * 1 +
(v @ rotate) * 0 is v), the norm weights are expanded over the batch once, and the step's rotary tables and
attention bias are built once for all layers. Every other operation is the one `LlamaModel` runs, in the same
order: generated tokens, logits and log-probs are the same bits, except for tied embeddings at batch < 16 (below).
The cache grows by concatenation as in the layer path: attending over a preallocated, masked width instead changed
the bits (Paddle's CPU softmax gave the masked columns tiny nonzero weights, and the longer probs @ v rounded
differently). The concatenated weights and
LM-head slices are copies made per generate call: ~180 MB for SmolLM2-135M.

Where alignment/cpu_kernels chose its decode GEMM kernel and the weights exceed the last-level cache
(`streams_from_memory`), every projection and the LM head are instead packed once per call into the kernel's column
panels (`Panels`: a copy of the decoder's weights, ~530 MB for SmolLM2-135M, kept with the model and rewritten in
place by its next decoder: `_KEPT_PANELS`), which it streams from memory faster
than MKL's sgemm reads the plain weights. Each output is then one multiply-add chain over K, so the logits differ
from the layer path's by float rounding (the same tokens in tests/cpu_kernels/test_decode_matmul.py), and these
GEMMs give a row the same bits at any batch size. Where it chose its decode attention kernel, a step's RoPE, cache
writes and attention run there, one call per layer (`_kernel_layer`; the verify step keeps the operations). Over
packed weights the whole layer is one call (cpu_kernels.decode_layer), with the bits of `_kernel_layer` over the
panels: where both decode kernels were chosen, or wherever the decode layer kernel was (measured at a decode step's
8 rows and an RL rollout's 16 and 32, from memory and from the cache: choice.DECODE_LAYER_USES); then the layers'
weights are packed whether or not the decode GEMM alone was chosen and whatever the model's size, and the LM head
stays MKL's. The panels cost memory (~0.45 GB for SmolLM2's layers) for as long as the model lives.

Gate and up stay two GEMMs over the model's own weights: one over [gate_proj | up_proj] took 40 ms a step over
SmolLM2's 30 layers at batch 32, its transpose 27 ms, the two 27 ms (2 AMD EPYC Zen 4 cores, MKL_DEBUG_CPU_TYPE=5).

A tied LM head multiplies by a transposed copy of the embedding ([hidden, vocab], as an untied head is stored)
instead of by the embedding with transpose_y: SmolLM2's head took 3.4 against 6.0 ms at batch 8 and 7.4 against
12.1 ms at batch 32 (2 AMD EPYC Zen 5 cores, family 26, MKL_DEBUG_CPU_TYPE=7; the same time either way on Zen 4
with 5). Below 16 rows MKL's transposed-B kernel rounds its dot products differently from its own result at 16 rows
and more, while the plain kernel gives one result at every batch from 2 rows on: the copy's logits are the bits a
scoring pass over many rows computes from the same hidden state, and differ from the layer path's decode step by
float rounding at batch 2-15 (SmolLM2, greedy, 64 tokens: the same tokens, log-probs up to 1.5e-5 apart at batch 8,
the same bits at batch 32).

Only plain single-process models qualify (`fusable`): LoRA adapters, tensor parallelism, biases, Qwen3's q/k norms
or a non-float32 model decode through the layers. RoPE scaling and layout are the model's (rope.py), row by row of
the tables.
"""
from __future__ import annotations

import math
import weakref
from typing import List, NamedTuple, Optional

import paddle
import paddle.nn.functional as F

from alignment import cpu_kernels as kernels
from alignment.cpu_env import last_level_cache_bytes
from alignment.models.llama import MASK_VALUE, LlamaForCausalLM, RMSNorm, attention_bias, masked_softmax, swiglu
from alignment.models.moe import MoeBlock
from alignment.models.rope import RopeConfig, rope_cos_sin, rotate_half_matrix
from alignment.parallel import tensor_parallel as tp


class Panels(NamedTuple):
    """A weight [K, N] copied into the column panels that cpu_kernels.panel_matmul streams (the decode_matmul
    kernel, where chosen: it read SmolLM2's weights from memory faster than MKL's sgemm at a decode step's rows)."""
    packed: paddle.Tensor  # [ceil(N / 32), K, 32]
    n: int


class LayerWeights(NamedTuple):  # each projection a weight [K, N] or its Panels
    input_norm: paddle.Tensor  # [b, 1, hidden]: the RMSNorm weight expanded over the batch
    qkv: object  # [hidden, (heads + 2 kv_heads) d]
    o: object  # [heads d, hidden]
    post_norm: paddle.Tensor  # [b, 1, hidden]
    gate: object  # [hidden, intermediate]: the model's own, or panels
    up: object  # [hidden, intermediate]
    down: object  # [intermediate, hidden]


def matmul(x, weight):
    """x [..., K] @ weight: a [K, N] tensor, or its Panels."""
    if isinstance(weight, Panels):
        return kernels.panel_matmul(x, weight.packed, weight.n)
    return paddle.matmul(x, weight)


# The panels made for an owner (a decoder layer, or the model for its LM head), by name: the next decoder of the same
# model packs into them in place. Made afresh at every generate call, SmolLM2's ~0.5 GB of panels left holes in the
# heap at every RL step that the training step's buffers did not fit in (SmolLM2 GRPO's peak RSS 8.47 GiB, kept
# 7.23: an AMD EPYC Zen 3, family 25 model 1); kept, they cost their size once. Decoders of one model share them:
# every decoder reads the model's current weights, and a decoder whose model changed under it stops at its next step
# (engine.py, StaleWeights) unless it reloads.
_KEPT_PANELS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def panels(weight, owner, name: str, transposed: bool = False, kernel: str = "decode_matmul"):
    """weight ([K, N], or [N, K] transposed) as Panels where `kernel` (the one that reads them) runs, else None;
    written into the panels kept for `owner` under `name` where it has them."""
    packed = kernels.pack_panels(weight, transposed, kernel)
    if packed is None:
        return None
    kept = _KEPT_PANELS.setdefault(owner, {})
    if name in kept and kept[name].shape == packed.shape:
        packed = paddle.assign(packed, output=kept[name])
    else:
        kept[name] = packed
    return Panels(packed, weight.shape[0 if transposed else 1])


def streams_from_memory(model) -> bool:
    """Whether a decode step's weights (every decoder layer's and the LM head's) exceed the last-level cache: the
    panels pay only then. From the cache MKL's sgemm was the faster (the peer's 33 MB policy in 300 MB of L3 on an
    Intel Xeon, family 6 model 207: GRPO's generate 0.161 s a step with MKL, 0.166 with the panels)."""
    head = model.model.embed_tokens.weight if model.config.tie_word_embeddings else model.lm_head.weight
    streamed = sum(int(p.size) for p in model.model.layers.parameters()) + int(head.size)  # float32
    return 4 * streamed > last_level_cache_bytes()


def fusable(model) -> bool:
    """A one-process float32 LlamaForCausalLM whose projections are bias-free plain Linear layers."""
    if type(model) is not LlamaForCausalLM or model.config.tensor_parallel_degree != 1:
        return False
    if any(p.dtype != paddle.float32 for p in model.parameters()):
        return False
    for layer in model.model.layers:
        attn, mlp = layer.self_attn, layer.mlp
        if isinstance(mlp, MoeBlock):  # experts decode through the layers
            return False
        linears = (attn.q_proj, attn.k_proj, attn.v_proj, attn.o_proj, mlp.gate_proj, mlp.up_proj, mlp.down_proj)
        if any(type(lin) is not tp.Linear or lin.bias is not None for lin in linears):
            return False
        if type(layer.input_layernorm) is not RMSNorm or type(layer.post_attention_layernorm) is not RMSNorm:
            return False
        if attn.q_norm is not None:  # Qwen3's per-head q/k norms
            return False
    return model.config.tie_word_embeddings or type(model.lm_head) is tp.Linear and model.lm_head.bias is None


def layer_weights(layer, batch: int, packer: Optional[str]) -> LayerWeights:
    """packer: the kernel whose panels hold the projections where it runs (None: the plain weights)."""
    attn, mlp = layer.self_attn, layer.mlp
    hidden = attn.q_proj.weight.shape[0]
    qkv = paddle.concat([attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight], axis=1)
    projections = [qkv, attn.o_proj.weight, mlp.gate_proj.weight, mlp.up_proj.weight, mlp.down_proj.weight]
    names = ("qkv", "o", "gate", "up", "down")
    qkv, o, gate, up, down = [panels(w, layer, n, kernel=packer) or w
                              for w, n in zip(projections, names)] if packer else projections
    return LayerWeights(paddle.expand(layer.input_layernorm.weight, [batch, 1, hidden]), qkv, o,
                        paddle.expand(layer.post_attention_layernorm.weight, [batch, 1, hidden]), gate, up, down)


# The LM head as GEMMs over [hidden, about this many] vocabulary slices: MKL streamed SmolLM2's [576, 49152] head
# at 15 GB/s in 8 slices, 12.5 GB/s whole (batch 8, 2 Zen 4 cores; 1, 4, 8, 16 and 32 slices measured); on Zen 5
# (MKL's AVX-512 path) 33 GB/s in 8, 29 whole, 35 in 16. A small head is fastest whole: [256, 8000] at batch 16 took
# 135 us whole, 198 in 8 slices and their concatenation (Zen 5). Each output column is the same dot product however
# the columns are sliced (the same bits, tested). The slices are copies.
HEAD_SLICE_COLUMNS = 6144


def head_slice_count(vocab: int) -> int:
    return max(1, round(vocab / HEAD_SLICE_COLUMNS))


def vocab_slices(weight, axis: int, count: int) -> List[paddle.Tensor]:
    """weight split along its vocabulary axis into `count` nearly equal [hidden, part] copies (fewer parts when the
    vocabulary is small); axis 0: weight is [vocab, hidden] (an embedding) and each part is transposed."""
    vocab = weight.shape[axis]
    count = max(1, min(count, vocab))
    sections = [vocab // count + (1 if i < vocab % count else 0) for i in range(count)]
    parts = paddle.split(weight, sections, axis=axis)
    return [paddle.assign(part.t()) for part in parts] if axis == 0 else parts


def rms_norm(x, weight, eps: float):
    """RMSNorm.forward for float32 x with its weight already expanded to x's shape (our CPU kernel where chosen,
    as RMSNorm.forward: the same bits as the layers)."""
    if kernels.chosen("rms_norm"):
        fused = kernels.rms_norm(x, weight.reshape([-1, weight.shape[-1]])[0], eps)  # the weight's first row [H]
        if fused is not None:
            return fused
    normed = x * paddle.rsqrt(paddle.square(x).mean(axis=-1, keepdim=True) + eps)
    return normed * weight


def step_rotary(position_ids, head_dim: int, rope: RopeConfig, heads: int, kv_heads: int):
    """position_ids [b, 1] -> cos, sin [b, heads + 2 kv_heads, d] for the fused q | k | v heads: q's carry
    attention's 1 / sqrt(d) as in `rotary_tables`, v's are 1 and 0 (v passes through unchanged)."""
    cos, sin = rope_cos_sin(position_ids, head_dim, rope, paddle.float32)  # [b, 1, 1, d]
    b, scale = position_ids.shape[0], 1.0 / math.sqrt(head_dim)

    def table(t, v_value):
        parts = [paddle.expand(paddle.scale(t, scale), [b, 1, heads, head_dim]),
                 paddle.expand(t, [b, 1, kv_heads, head_dim]), paddle.full([b, 1, kv_heads, head_dim], v_value)]
        return paddle.concat(parts, axis=2).reshape([b, heads + 2 * kv_heads, head_dim])

    return table(cos, 1.0), table(sin, 0.0)


class FusedDecoder:
    """Decode steps over a SlotCache (slot_cache.py) with the model's weights in the fused layout, expanded over
    the cache's slots."""

    grows_cache = True  # any cache width (slot_cache.py's ladder)

    def __init__(self, model, slots: int, packed: Optional[bool] = None):
        """packed: the weights in the decode kernels' panels where one runs (default: the layers' wherever the
        decode layer kernel was chosen, every projection's and the LM head's where they stream from memory,
        `streams_from_memory`; False: none)."""
        cfg, attn = model.config, model.model.layers[0].self_attn
        self.batch = slots
        self.packed = streams_from_memory(model) if packed is None else packed
        self.heads, self.kv_heads, self.head_dim = attn.num_heads, attn.num_kv_heads, attn.head_dim
        self.eps, self.rope = cfg.rms_norm_eps, cfg.rope
        self.tied = cfg.tie_word_embeddings
        self.attention_kernel = kernels.chosen("decode_attention")
        layer = packed is not False and kernels.chosen("decode_layer")
        # the layers' panels: the decode GEMM's where it runs over weights from memory, else the layer kernel's
        self.packer = "decode_matmul" if self.packed and kernels.chosen("decode_matmul") else (
            "decode_layer" if layer else None)
        self.layer_kernel = self.packer is not None and (layer or self.attention_kernel)
        self.load_weights(model)
        self.rotate = rotate_half_matrix(self.head_dim, paddle.float32, self.rope.interleaved)
        self.rotary = (None, None)  # step_rotary of positions 0 .. len - 1, [positions, heads + 2 kv_heads, d]

    def load_weights(self, model) -> None:
        """Copy the model's weights into the fused layout (again after they change mid-generation: partial
        rollouts' in-flight weight updates)."""
        self.layers = self.kernel_layers = self.head_slices = []  # the old copies go before the new ones come
        self.layers = [layer_weights(layer, self.batch, self.packer) for layer in model.model.layers]
        # where the decode layer kernel runs, a layer is one call (cpu_kernels.decode_layer) over, per layer, the
        # norm weights [hidden] and the five packed panels
        packed = self.layer_kernel and isinstance(self.layers[0].qkv, Panels)
        self.kernel_layers = [(layer.input_layernorm.weight, layer.post_attention_layernorm.weight,
                               tuple(p.packed for p in (w.qkv, w.o, w.gate, w.up, w.down)))
                              for layer, w in zip(model.model.layers, self.layers)] if packed else []
        self.final_norm = paddle.expand(model.model.norm.weight, [self.batch, 1, model.config.hidden_size])
        self.embedding = model.model.embed_tokens.weight  # [vocab, hidden]
        head = self.embedding if self.tied else model.lm_head.weight  # lm_head: [hidden, vocab]
        axis = 0 if self.tied else 1  # the vocabulary's
        packed = panels(head, model, "lm_head", transposed=self.tied) if self.packed else None
        self.head_slices = [packed] if packed else vocab_slices(head, axis, head_slice_count(head.shape[axis]))

    def step(self, token, cache, column, mask, position):
        """Feed `token` [b] at `column` [b] of `cache` (a SlotCache, written in place) with the attention `mask`
        [b, width] and RoPE `position` [b, 1]; return the logits [b, vocab] float32 for the token after it."""
        b = self.batch
        cos, sin = self.rotary_rows(position.reshape([b]), cache.width)
        x = F.embedding(token.unsqueeze(-1), self.embedding)  # [b, 1, hidden]
        if self.attention_kernel or self.kernel_layers:
            bias = (1 - mask.astype("float32")) * MASK_VALUE  # [b, width]
            if self.kernel_layers:  # a layer in one call
                for i, (input_norm, post_norm, packed) in enumerate(self.kernel_layers):
                    x = kernels.decode_layer(x, cos, sin, cache.k[i], cache.v[i], column, bias, input_norm,
                                             post_norm, packed, self.heads, self.rope.interleaved, self.eps)
            else:
                for i, weights in enumerate(self.layers):
                    x = self._kernel_layer(x, weights, cache.k[i], cache.v[i], column, cos, sin, bias)
            return self._head(x).reshape([b, -1])
        bias = attention_bias(mask, 1, paddle.float32, self.heads)
        bias = bias.reshape([b, self.kv_heads, self.heads // self.kv_heads, -1])  # [b, kv_heads, groups, width]
        index = paddle.expand(column.reshape([b, 1, 1, 1]), [b, self.kv_heads, 1, self.head_dim])
        for i, weights in enumerate(self.layers):
            x = self._layer(x, weights, cache.k[i], cache.v[i], index, cos, sin, bias)
        return self._head(x).reshape([b, -1])

    def rotary_rows(self, positions, width: int):
        """cos, sin [b, heads + 2 kv_heads, d] of positions [b] (each below `width`): rows of tables built for every
        position up to the width (rebuilt twice as long when a wider one comes); the same bits as step_rotary of
        the positions, with one gather a step instead of a dozen small ops (80 -> 8 us at [16, 4 + 2 x 4, 64])."""
        if self.rotary[0] is None or self.rotary[0].shape[0] < width:
            every = paddle.arange(2 * width, dtype="int64").reshape([-1, 1])  # [positions, 1]
            self.rotary = step_rotary(every, self.head_dim, self.rope, self.heads, self.kv_heads)
        return paddle.gather(self.rotary[0], positions), paddle.gather(self.rotary[1], positions)

    def _layer(self, x, w: LayerWeights, k_cache, v_cache, index, cos, sin, bias):
        b, heads, kv_heads, d = self.batch, self.heads, self.kv_heads, self.head_dim
        qkv = matmul(rms_norm(x, w.input_norm, self.eps), w.qkv).reshape([b, heads + 2 * kv_heads, d])
        qkv = qkv * cos + paddle.matmul(qkv, self.rotate) * sin
        q, k, v = paddle.split(qkv, [heads, kv_heads, kv_heads], axis=1)
        k_cache.put_along_axis_(index, k.reshape([b, kv_heads, 1, d]), 2)  # [b, kv_heads, width, d], in place
        v_cache.put_along_axis_(index, v.reshape([b, kv_heads, 1, d]), 2)
        # q head i attends with kv head i // groups (Attention's folded decode step)
        scores = paddle.matmul(q.reshape([b, kv_heads, heads // kv_heads, d]), k_cache, transpose_y=True)
        out = paddle.matmul(masked_softmax(scores, bias), v_cache).reshape([b, 1, heads * d])
        return self._mlp(x + matmul(out, w.o), w)

    def _kernel_layer(self, x, w: LayerWeights, k_cache, v_cache, column, cos, sin, bias):
        """_layer with RoPE, the cache writes and the attention in one kernel (cpu_kernels.decode_attention)."""
        qkv = matmul(rms_norm(x, w.input_norm, self.eps), w.qkv).reshape([self.batch, -1, self.head_dim])
        out = kernels.decode_attention(qkv, cos, sin, k_cache, v_cache, column, bias, self.heads,
                                       self.rope.interleaved)  # [b, 1, heads d]
        return self._mlp(x + matmul(out, w.o), w)

    def _mlp(self, x, w: LayerWeights):
        """The layer's second half: x plus the SwiGLU MLP of its post-attention norm."""
        h = rms_norm(x, w.post_norm, self.eps)
        gate, up = matmul(h, w.gate), matmul(h, w.up)
        return x + matmul(swiglu(gate, up), w.down)

    def verify(self, tokens, cache, columns, mask, positions):
        """Feed tokens [b, s] at columns [b, s] of `cache` (written in place), query j attending to the columns of
        mask [b, s, width] at RoPE positions [b, s]: speculative decoding's verify step (speculative_step.py).
        -> logits [b, s, vocab] float32, after each token. The step's ops in the layout of `step`, s queries
        per row (its bits differ from s one-token steps by float rounding: other GEMM shapes)."""
        b, s = tokens.shape
        groups = self.heads // self.kv_heads
        bias = ((1 - mask.astype("float32")) * MASK_VALUE).reshape([b, 1, 1, s, -1])
        bias = paddle.expand(bias, [b, self.kv_heads, groups, s, cache.width]).reshape(
            [b, self.kv_heads, groups * s, cache.width])  # [b, kv_heads, groups s, width]: q heads by position
        cos, sin = (t.reshape([b, s, -1, self.head_dim]) for t in self.rotary_rows(positions.reshape([-1]),
                                                                                     cache.width))
        index = paddle.expand(columns.reshape([b, 1, s, 1]), [b, self.kv_heads, s, self.head_dim])
        x = F.embedding(tokens, self.embedding)  # [b, s, hidden]
        for i, weights in enumerate(self.layers):
            x = self._verify_layer(x, weights, cache.k[i], cache.v[i], index, cos, sin, bias)
        return self._head(x)

    def _head(self, x):
        """x [b, s, hidden] -> logits [b, s, vocab]: the final norm and the LM head, slice by vocabulary slice."""
        hidden = rms_norm(x, self.final_norm, self.eps)
        logits = [matmul(hidden, part) for part in self.head_slices]  # [b, s, part]
        return paddle.concat(logits, axis=-1) if len(logits) > 1 else logits[0]

    def _verify_layer(self, x, w: LayerWeights, k_cache, v_cache, index, cos, sin, bias):
        b, s = x.shape[0], x.shape[1]
        heads, kv_heads, d = self.heads, self.kv_heads, self.head_dim
        qkv = matmul(rms_norm(x, w.input_norm, self.eps), w.qkv).reshape([b, s, heads + 2 * kv_heads, d])
        qkv = qkv * cos + paddle.matmul(qkv, self.rotate) * sin
        q, k, v = paddle.split(qkv, [heads, kv_heads, kv_heads], axis=2)  # [b, s, *, d]
        k_cache.put_along_axis_(index, k.transpose([0, 2, 1, 3]), 2)  # [b, kv_heads, width, d], in place
        v_cache.put_along_axis_(index, v.transpose([0, 2, 1, 3]), 2)
        q = q.transpose([0, 2, 1, 3]).reshape([b, kv_heads, heads // kv_heads * s, d])  # q head i: kv head i // groups
        scores = paddle.matmul(q, k_cache, transpose_y=True)  # [b, kv_heads, groups s, width]
        out = paddle.matmul(masked_softmax(scores, bias), v_cache).reshape([b, heads, s, d])
        return self._mlp(x + matmul(out.transpose([0, 2, 1, 3]).reshape([b, s, heads * d]), w.o), w)
