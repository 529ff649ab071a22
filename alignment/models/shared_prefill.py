"""The prompt pass of `generate` run once per distinct prompt when rows repeat one (GRPO's answers to a prompt):
its KV cache and final hidden state are repeated over the prompt's rows, and the logits of the first new token
come from the LM head over all rows, as before. SmolLM2-135M at the GRPO benchmark's shape (4 prompts x 8 rows of
52 columns): 2.5 -> 0.4 s per generate call (2 AMD EPYC Zen 4 cores), plus the check below the first time
a shape is seen.

A row's prefill bits depend on how MKL computes that row of each GEMM, and its kernels differ with the number of
rows M: SmolLM2's layer GEMMs gave every row the same bits for any M above 32 with 2 threads (above 71 with 1),
the tiny test models' did not for many M (2 threads, MKL_DEBUG_CPU_TYPE=5, measured). So the shared pass is only
taken after a check: the first decoder layer, run on the real inputs both ways, must give the same bits (every
layer has the same shapes, so the same kernels). The verdict is kept per shape; where the check fails, every row
runs its own prompt as before.
"""
from __future__ import annotations

from typing import Dict, Optional, Tuple

import numpy as np
import paddle

from alignment.models.fused_decode import fusable
from alignment.models.llama import attention_bias, positions_from_mask, rotary_tables

_VERDICTS: Dict[tuple, bool] = {}  # (model shape, distinct rows, rows, width) -> the first layer agreed


def distinct_prompts(input_ids, attention_mask) -> Optional[Tuple[paddle.Tensor, paddle.Tensor]]:
    """(first [u]: a row per distinct prompt, inverse [b]: each row's prompt among them), or None when no prompt
    repeats. Rows count as the same prompt when their ids and masks are equal (padding ids included)."""
    keys = np.concatenate([input_ids.numpy(), attention_mask.numpy()], axis=1)
    _, first, inverse = np.unique(keys, axis=0, return_index=True, return_inverse=True)
    if len(first) == len(keys):
        return None
    return paddle.to_tensor(first, dtype="int64"), paddle.to_tensor(inverse.reshape(-1), dtype="int64")


def _first_layer(model, input_ids, attention_mask):
    """LlamaModel.forward's first decoder layer on these rows: (hidden, (k, v))."""
    inner, cfg = model.model, model.config
    x = inner.embed_tokens(input_ids)
    attn = inner.layers[0].self_attn
    rope = rotary_tables(positions_from_mask(attention_mask), cfg.head_dim, cfg.rope_theta, x.dtype,
                         attn.num_heads, attn.num_kv_heads)
    bias = attention_bias(attention_mask, input_ids.shape[1], x.dtype, attn.num_heads)
    return inner.layers[0](x, rope, bias)


def rows_agree(model, input_ids, attention_mask, first, inverse) -> bool:
    """Does the first layer give each row the same bits run over the distinct prompts as over all rows?"""
    cfg = model.config
    key = (cfg.hidden_size, cfg.intermediate_size, cfg.num_attention_heads, cfg.num_key_value_heads,
           cfg.head_dim, int(first.shape[0]), *input_ids.shape)
    if key not in _VERDICTS:
        every = _first_layer(model, input_ids, attention_mask)
        once = _first_layer(model, paddle.gather(input_ids, first), paddle.gather(attention_mask, first))
        pairs = [(every[0], once[0]), (every[1][0], once[1][0]), (every[1][1], once[1][1])]
        _VERDICTS[key] = all(np.array_equal(a.numpy(), paddle.gather(b, inverse).numpy()) for a, b in pairs)
    return _VERDICTS[key]


def prefill(model, input_ids, attention_mask, use_cache: bool, share: bool = True):
    """-> (logits [b, vocab] of the token after the prompt, past_key_values or None): the model's last_only
    forward, with each distinct prompt run once when `share` and the rows agree (see the module notes). Only a
    plain one-process float32 LLaMA (fused_decode.fusable) shares."""
    groups = distinct_prompts(input_ids, attention_mask) if share and use_cache and fusable(model) else None
    if groups is not None and rows_agree(model, input_ids, attention_mask, *groups):
        hidden, presents = model.model.prompts_once(input_ids, attention_mask, *groups)  # [b, P, hidden]
        return model.compute_logits(hidden[:, -1:])[:, -1], presents
    out = model(input_ids, attention_mask=attention_mask, use_cache=use_cache, last_only=True)
    return out.logits[:, -1], out.past_key_values
