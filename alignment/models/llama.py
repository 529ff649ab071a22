"""A LLaMA-family causal LM in plain Paddle: RMSNorm, RoPE (rope.py), grouped-query attention, SwiGLU, KV cache;
Qwen2's q/k/v bias, Qwen3's per-head q/k RMSNorm, ERNIE 4.5's interleaved RoPE and `use_bias`, the MoE families'
expert layers (moe.py) (the family's row in config.py's FAMILIES).

Parameter names equal the Hugging Face ones (`model.layers.0.self_attn.q_proj.weight`, ...), so checkpoint
conversion is a transpose of the Linear weights (Paddle stores them [in, out], HF [out, in]); see checkpoint.py.
Shapes: b = batch, s = new (query) positions, t = all key positions (cache + new), h = heads, d = head_dim.
"""
from __future__ import annotations

from typing import List, NamedTuple, Optional, Tuple

import numpy as np
import paddle
import paddle.nn as nn
import paddle.nn.functional as F
from paddle.distributed.fleet.utils import recompute

from alignment import cpu_kernels as kernels
from alignment.models.checkpoint import PretrainedMixin
from alignment.models.config import LlamaConfig
from alignment.models.moe import moe_block
from alignment.models.rope import Rotary, rope_heads_first, rotary_tables
from alignment.parallel import tensor_parallel as tp
from alignment.models.logprobs import entropy_from_logits, gather_log_probs, log_probs_and_entropy

KVCache = List[Tuple[paddle.Tensor, paddle.Tensor]]  # per layer (k, v), each [b, kv_heads, t, d] (HF's layout)
MASK_VALUE = -1e9  # finite, so a query whose keys are all padding gets uniform attention instead of NaN


class CausalLMOutput(NamedTuple):
    logits: Optional[paddle.Tensor]  # [b, s, vocab] (None when only hidden states were asked for)
    hidden_states: paddle.Tensor  # [b, s, hidden] after the final norm
    past_key_values: Optional[KVCache]


class RMSNorm(nn.Layer):
    def __init__(self, hidden_size: int, eps: float):
        super().__init__()
        self.weight = self.create_parameter([hidden_size], default_initializer=nn.initializer.Constant(1.0))
        self.eps = eps

    def forward(self, x):
        weight = self.scale()  # [H]
        fused = kernels.rms_norm(x, weight, self.eps)  # our CPU kernel where chosen (alignment/cpu_kernels)
        if fused is not None:
            return fused
        # paddle.square is ~3x faster than x.pow(2) on CPU (measured)
        x32 = x if x.dtype == paddle.float32 else x.astype("float32")
        variance = paddle.square(x32).mean(axis=-1, keepdim=True)
        normed = x32 * paddle.rsqrt(variance + self.eps)
        normed = normed if normed.dtype == x.dtype else normed.astype(x.dtype)
        # expanded first: a broadcasting multiply's forward and backward are several times slower on CPU (measured)
        return normed * paddle.expand(weight, normed.shape)

    def scale(self):
        return self.weight


class HeadNorm(RMSNorm):
    """RMSNorm over each head's features with one weight for all heads (Qwen3's q and k norms). Under tensor
    parallelism a rank holds some of the heads, so its gradient of the weight is its heads' part: summed over the
    group, every rank takes the one-process step."""

    def __init__(self, head_dim: int, eps: float, degree: int):
        super().__init__(head_dim, eps)
        self.degree = degree

    def scale(self):
        return tp.gradient_summed_over_group(self.weight, self.degree)


def attention_bias(attention_mask, query_len: int, dtype, heads: int = 1):
    """attention_mask [b, t] (1 = real token, covering cache + new) -> additive bias [b, heads, s, t], causal.
    Built once per forward at the score's full shape: adding a [b, 1, s, t] bias by broadcasting was ~14x slower
    on CPU than a same-shape add (measured). A [b, s, t] mask gives each query its own keys (the decode engine's
    multi-token verify step over its slot cache, speculative_step.py)."""
    b, total = attention_mask.shape[0], attention_mask.shape[-1]
    if attention_mask.ndim == 3:
        bias = ((1 - attention_mask.astype(dtype)) * MASK_VALUE).unsqueeze(1)  # [b, 1, s, t]
    elif query_len == 1:  # a decode step: the one query is the newest position, so causality masks nothing
        bias = ((1 - attention_mask.astype(dtype)) * MASK_VALUE).reshape([b, 1, 1, total])
    else:
        key_pos = paddle.arange(total).unsqueeze(0)  # [1, t]
        query_pos = paddle.arange(total - query_len, total).unsqueeze(1)  # [s, 1]
        allowed = (key_pos <= query_pos).unsqueeze(0) & (attention_mask.unsqueeze(1) > 0)  # [b, s, t]
        zeros = paddle.zeros(allowed.shape, dtype=dtype)
        bias = paddle.where(allowed, zeros, paddle.full_like(zeros, MASK_VALUE)).unsqueeze(1)
    return paddle.expand(bias, [b, heads, query_len, total])


def positions_from_mask(attention_mask):
    """Position ids that skip left padding: [b, t] -> [b, t], 0 at the first real token."""
    return paddle.clip(attention_mask.astype("int64").cumsum(axis=-1) - 1, min=0)


class Attention(nn.Layer):
    def __init__(self, config: LlamaConfig):
        super().__init__()
        degree = config.tensor_parallel_degree  # each rank holds num_heads / degree whole heads
        self.num_heads = config.num_attention_heads // degree
        self.num_kv_heads = config.num_key_value_heads // degree
        self.head_dim = config.head_dim
        qkv_bias = config.attention_bias or config.qkv_bias
        hidden, d = config.hidden_size, config.head_dim
        self.q_proj = tp.column_linear(hidden, config.num_attention_heads * d, qkv_bias, degree)
        self.k_proj = tp.column_linear(hidden, config.num_key_value_heads * d, qkv_bias, degree)
        self.v_proj = tp.column_linear(hidden, config.num_key_value_heads * d, qkv_bias, degree)
        self.o_proj = tp.row_linear(config.num_attention_heads * d, hidden, config.attention_bias, degree)
        # Qwen3: an RMSNorm over each head's d features of q and of k, before RoPE (weights [d], shared by the heads)
        self.q_norm = HeadNorm(d, config.rms_norm_eps, degree) if config.qk_norm else None
        self.k_norm = HeadNorm(d, config.rms_norm_eps, degree) if config.qk_norm else None

    def forward(self, x, rope: Rotary, bias, past: Optional[Tuple] = None, cache_column=None):
        """cache_column [1] or [b] int64: `past` is a preallocated [b, kv_heads, L, d] cache and this single
        token's k/v are written at that column (of each row): the decode engine's SlotCache, eager (in place) or
        compiled (static_decode.py); [b, s]: the s tokens' columns (a verify step); otherwise they are appended to
        `past`."""
        b, s, _ = x.shape
        q = self.q_proj(x).reshape([b, s, self.num_heads, self.head_dim])
        k = self.k_proj(x).reshape([b, s, self.num_kv_heads, self.head_dim])
        v = self.v_proj(x).reshape([b, s, self.num_kv_heads, self.head_dim])
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)  # [b, s, heads, d], normalised over d
        q = rope_heads_first(q, rope.cos_q, rope.sin_q, rope)  # [b, h, s, d]
        # the cache is kept head-major, so a decode step transposes its one new position, not the whole cache
        k = rope_heads_first(k, rope.cos_k, rope.sin_k, rope)  # [b, kv_heads, s, d]
        v = v.transpose([0, 2, 1, 3])
        if past is not None and cache_column is not None:
            # a scatter, not a one-hot blend: broadcasting multiplies are ~40x slower than same-shape ones on CPU
            column = cache_column.reshape([-1, 1, 1, 1]) if cache_column.ndim == 1 else \
                cache_column.unsqueeze(1).unsqueeze(-1)  # [b or 1, 1, s, 1]
            index = paddle.expand(column, k.shape)  # [b, kv_heads, s, d]
            if paddle.in_dynamic_mode():  # the engine's own cache: no copy of it per step
                k = past[0].put_along_axis_(index, k, 2)  # [b, kv_heads, L, d]
                v = past[1].put_along_axis_(index, v, 2)
            else:
                k = paddle.put_along_axis(past[0], index, k, axis=2)
                v = paddle.put_along_axis(past[1], index, v, axis=2)
        elif past is not None:
            k = paddle.concat([past[0], k], axis=2)  # [b, kv_heads, t, d]
            v = paddle.concat([past[1], v], axis=2)
        present = (k, v)
        groups = self.num_heads // self.num_kv_heads
        folded = s == 1 and groups > 1
        if folded:
            # a decode step attends without repeating the cache: q head i uses kv head i // groups (HF's
            # repeat_kv), so one kv head's q heads are consecutive and fold into its query rows (measured on
            # SmolLM2's shape, [8, 9 -> 3, 1, 64] against 200 cached positions: 983 -> 212 us per layer). Training
            # shapes keep the repeat: the folded product rounds differently per batch shape, and the layout tests
            # compare a batch split over processes with the whole batch to 1e-5.
            q = q.reshape([b, self.num_kv_heads, groups, self.head_dim])  # [b, kv_heads, groups, d]
            bias = bias.reshape([b, self.num_kv_heads, groups, -1])  # [b, kv_heads, groups, t]
        elif groups > 1:
            k = k.repeat_interleave(groups, axis=1)  # [b, h, t, d]
            v = v.repeat_interleave(groups, axis=1)
        # plain matmul-softmax: ~3x faster than F.scaled_dot_product_attention for CPU generation (measured);
        # q carries 1 / sqrt(d) from its rotary tables
        scores = paddle.matmul(q, k, transpose_y=True)  # [b, h, s, t] (folded: [b, kv_heads, groups, t])
        probs = masked_softmax(scores, bias).astype(q.dtype)
        out = paddle.matmul(probs, v)  # [b, h, s, d] (folded: [b, kv_heads, groups, d], the heads in order)
        if not folded:
            out = out.transpose([0, 2, 1, 3])  # [b, s, h, d]
        out = out.reshape([b, s, self.num_heads * self.head_dim])
        return self.o_proj(out), present


class MLP(nn.Layer):
    def __init__(self, config: LlamaConfig):
        super().__init__()
        bias, degree = config.mlp_bias, config.tensor_parallel_degree
        self.gate_proj = tp.column_linear(config.hidden_size, config.intermediate_size, bias, degree)
        self.up_proj = tp.column_linear(config.hidden_size, config.intermediate_size, bias, degree)
        self.down_proj = tp.row_linear(config.intermediate_size, config.hidden_size, bias, degree)

    def forward(self, x):
        return self.down_proj(swiglu(self.gate_proj(x), self.up_proj(x)))


def masked_softmax(scores, bias):
    """softmax(scores + bias) over the last axis in float32, scores and bias [..., t]: our CPU kernel where chosen
    (alignment/cpu_kernels), else Paddle's add and softmax."""
    fused = kernels.attention_softmax(scores, bias)
    return F.softmax((scores + bias).astype("float32"), axis=-1) if fused is None else fused


def swiglu(gate, up):
    """silu(gate) * up: our CPU kernel where chosen (alignment/cpu_kernels), else Paddle's two operations."""
    fused = kernels.swiglu(gate, up)
    return F.silu(gate) * up if fused is None else fused


class DecoderLayer(nn.Layer):
    def __init__(self, config: LlamaConfig, index: int = 0):
        super().__init__()
        self.self_attn = Attention(config)
        self.mlp = moe_block(config, index) or MLP(config)  # the family's sparse layers: experts (moe.py)
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(self, x, rope: Rotary, bias, past=None, cache_column=None):
        attn, present = self.self_attn(self.input_layernorm(x), rope, bias, past, cache_column)
        x = x + attn
        return x + self.mlp(self.post_attention_layernorm(x)), present


class LlamaModel(nn.Layer):
    """The decoder stack without a head: used by the causal LM and by score models (reward, critic)."""

    def __init__(self, config: LlamaConfig):
        super().__init__()
        self.config = config
        # no padding_idx: pad may be a real token (SmolLM2 pads with <|im_end|>), whose embedding must not be zero
        self.embed_tokens = tp.embedding(config.vocab_size, config.hidden_size, config.tensor_parallel_degree)
        self.layers = nn.LayerList([DecoderLayer(config, i) for i in range(config.num_hidden_layers)])
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(self, input_ids, attention_mask=None, position_ids=None, past_key_values: Optional[KVCache] = None,
                use_cache: bool = False, cache_column=None):
        """input_ids [b, s]; attention_mask [b, t] over cache + new tokens; position_ids [b, s]. With cache_column
        (static decode, see static_decode.py) the cache is preallocated and attention_mask covers its width."""
        b, s = input_ids.shape
        past_len = 0 if past_key_values is None or cache_column is not None else past_key_values[0][0].shape[2]
        if attention_mask is None:
            attention_mask = paddle.ones([b, past_len + s], dtype="int64")
        if position_ids is None:
            position_ids = positions_from_mask(attention_mask)[:, past_len:]
        x = self.embed_tokens(input_ids)
        attn = self.layers[0].self_attn
        rope = rotary_tables(position_ids, self.config.head_dim, self.config.rope, x.dtype,
                             attn.num_heads, attn.num_kv_heads)
        bias = attention_bias(attention_mask, s, x.dtype, attn.num_heads)
        presents = []
        for i, layer in enumerate(self.layers):
            past = None if past_key_values is None else past_key_values[i]
            if self.config.recompute and self.training and not use_cache:
                # non-reentrant recompute of the hidden state only: the reentrant PyLayer path crashed on the
                # (k, v) outputs that training does not need
                x = recompute(lambda h, layer=layer, past=past: layer(h, rope, bias, past)[0], x,
                              use_reentrant=False)
                present = None
            else:
                x, present = layer(x, rope, bias, past, cache_column)
            presents.append(present)
        return self.norm(x), (presents if use_cache else None)

    def forward_sharing_prompts(self, input_ids, attention_mask, prompt_len: int, prompt_groups):
        """forward() of rows whose left-padded prompts (the first prompt_len columns) repeat, e.g. GRPO's answers
        to one prompt: each distinct prompt runs once and its rows attend to its keys and values (their gradients
        add up there), instead of once per row. input_ids, attention_mask [n, P + R]; prompt_groups [n] int64:
        each row's prompt among the distinct ones (numbered 0 .. u - 1).
        -> hidden [n, P + R, hidden]: forward()'s up to float rounding."""
        first = paddle.to_tensor(np.unique(prompt_groups.numpy(), return_index=True)[1])  # [u]: a row per prompt
        prompt_hidden, past = self.prompts_once(input_ids[:, :prompt_len], attention_mask[:, :prompt_len], first,
                                                prompt_groups)
        hidden, _ = self(input_ids[:, prompt_len:], attention_mask, past_key_values=past)  # [n, R, hidden]
        return paddle.concat([prompt_hidden, hidden], axis=1)

    def prompts_once(self, input_ids, attention_mask, first, groups):
        """forward(use_cache=True) over the rows `first` [u] only, repeated over the rows: groups [n] names each
        row's among them. input_ids, attention_mask [n, P] -> (hidden [n, P, hidden], KV cache of n rows)."""
        hidden, cache = self(paddle.gather(input_ids, first), paddle.gather(attention_mask, first), use_cache=True)
        return paddle.gather(hidden, groups), [(paddle.gather(k, groups), paddle.gather(v, groups)) for k, v in cache]


class LlamaForCausalLM(PretrainedMixin, nn.Layer):
    config_class = LlamaConfig

    def __init__(self, config: LlamaConfig):
        super().__init__()
        self.config = config
        self.model = LlamaModel(config)
        if not config.tie_word_embeddings:
            self.lm_head = tp.column_linear(config.hidden_size, config.vocab_size, False,
                                            config.tensor_parallel_degree)
        init_weights(self, config.initializer_range)

    def compute_logits(self, hidden):
        """hidden [b, s, hidden] -> logits [b, s, vocab] in float32 (whole vocabulary on every rank)."""
        if self.config.tensor_parallel_degree > 1:
            return tp.gather_vocab(self._vocab_slice_logits(hidden)).astype("float32")
        if self.config.tie_word_embeddings:
            logits = paddle.matmul(hidden, self.model.embed_tokens.weight, transpose_y=True)
        else:
            logits = self.lm_head(hidden)
        return logits.astype("float32")

    def _vocab_slice_logits(self, hidden):
        """Tensor parallel: logits over this rank's vocabulary slice [b, s, vocab / degree]."""
        if self.config.tie_word_embeddings:
            return tp.vocab_logits(hidden, weight_t=self.model.embed_tokens.weight)
        return tp.vocab_logits(hidden, lm_head=self.lm_head)

    def token_log_probs(self, hidden, labels, temperature: float = 1.0, with_entropy: bool = False,
                        entropy_grad: bool = False):
        """hidden [..., hidden] at the positions predicting labels [...] -> (log p(label) [...], entropy [...]
        or None), logits divided by temperature. Under tensor parallelism the log-probs come from the
        vocab-parallel cross-entropy (logits stay split); the entropy, a logged statistic, from gathered logits.
        entropy_grad: the entropy stays in the autograd graph (an entropy bonus; not under tensor parallelism)."""
        if self.config.tensor_parallel_degree > 1:
            if entropy_grad:
                raise ValueError("key 'entropy_coeff' > 0 is not supported with tensor_parallel_degree > 1 yet")
            log_probs = tp.parallel_token_log_probs(self._vocab_slice_logits(hidden) / temperature, labels)
            if not with_entropy:
                return log_probs, None
            with paddle.no_grad():
                return log_probs, entropy_from_logits(self.compute_logits(hidden.detach()) / temperature)
        if temperature != 1.0:
            # the head is linear without a bias, so (h / T) W = (h W) / T: scaling [.., hidden] instead of the
            # [.., vocab] logits saved ~17 ms of every [16, 32, 8000] forward + backward on CPU (measured)
            hidden = paddle.scale(hidden, 1.0 / temperature)
        logits = self.compute_logits(hidden)
        if with_entropy and not entropy_grad:  # a logged statistic, out of the autograd graph
            return log_probs_and_entropy(logits, labels)
        log_probs = gather_log_probs(logits, labels)
        return log_probs, entropy_from_logits(logits) if with_entropy else None

    def forward(self, input_ids, attention_mask=None, position_ids=None, past_key_values=None, use_cache=False,
                last_only: bool = False, cache_column=None) -> CausalLMOutput:
        """last_only: compute logits for the final position only (generation), saving a [b, s, vocab] matmul."""
        hidden, presents = self.model(input_ids, attention_mask, position_ids, past_key_values, use_cache,
                                      cache_column)
        logits = self.compute_logits(hidden[:, -1:] if last_only else hidden)
        return CausalLMOutput(logits, hidden, presents)

    def num_parameters(self) -> int:
        return sum(int(p.numel()) for p in self.parameters())


def init_weights(layer: nn.Layer, std: float) -> None:
    """HF's initialisation: normal(0, std) for Linear and Embedding weights, zero biases, unit norms. A
    tensor-parallel weight draws the whole tensor and keeps its slice, so every degree starts from the same model."""
    for sub in layer.sublayers(include_self=True):
        weight = getattr(sub, "weight", None)
        if isinstance(sub, tp.linear_layer_types()) or isinstance(sub, nn.Embedding) or (
                weight is not None and tp.is_split(weight) and weight.ndim == 2):
            full = paddle.normal(0.0, std, tp.whole_shape(weight)).astype(weight.dtype)
            weight.set_value(tp.local_slice(full, weight) if tp.is_split(weight) else full)
        bias = getattr(sub, "bias", None)
        if isinstance(sub, tp.linear_layer_types()) and bias is not None:
            bias.set_value(paddle.zeros(bias.shape, dtype=bias.dtype))
