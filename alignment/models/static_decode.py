"""The decode engine's step (engine.py) as a static-graph program (`paddle.jit.to_static`, fixed shapes).

Eager decoding pays Python dispatch for every op of every step (~235 calls per step for a LLaMA); compiled once per
(slots, cache width), the step runs as one program over the engine's SlotCache: each row's token is written at its
own column (`put_along_axis`), a [b, L] mask hides the columns not written yet. The width is the prompt width
plus the new tokens, rounded up to a multiple of CACHE_BUCKET so nearby prompt widths share a program. Same model,
same weights, same RoPE positions as the eager step; `tests/models/test_static_decode.py` checks the tokens are the
same.

For export (tools/export_model.py) `CachedForward` is one program for both phases, with dynamic batch, width and
cache length: the prefill is the call with an empty (length 0) cache, a decode step the call with one new token.
The cache grows by concatenation, so one set of weights serves both phases.
"""
from __future__ import annotations

from typing import Dict, Optional, Tuple

import numpy as np
import paddle
import paddle.nn as nn

from alignment.models.moe import moe_blocks

CACHE_BUCKET = 32


class DecodeStep(nn.Layer):
    """token [b, 1], position_ids [b, 1], attention_mask [b, L], column [b] int64 (the cache column each row's
    token is written at), caches: a list of 2 x layers tensors [b, kv_heads, L, d] -> (logits [b, vocab], updated
    list, and for an MoE model the experts each row's token was routed to [b, sparse layers, k] (routing replay's
    record; a dense model: none))."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, token, position_ids, attention_mask, column, caches):
        past = [(caches[2 * i], caches[2 * i + 1]) for i in range(len(caches) // 2)]
        blocks = moe_blocks(self.model)
        for block in blocks:
            block.trace = []  # the program's choices, as outputs (not the blocks' attributes)
        out = self.model(token, attention_mask=attention_mask, position_ids=position_ids, past_key_values=past,
                         use_cache=True, last_only=True, cache_column=column)
        routing = [paddle.stack([block.trace.pop() for block in blocks], axis=1)] if blocks else []  # [b, layers, k]
        for block in blocks:
            block.trace = None
        return out.logits[:, -1], [t for kv in out.past_key_values for t in kv], *routing


class CachedForward(nn.Layer):
    """input_ids [b, s], attention_mask [b, t + s] (cache + new), position_ids [b, s], caches: a list of
    2 x layers tensors [b, kv_heads, t, d] (t = 0 for the prefill) -> (logits [b, vocab] at the last position,
    the caches extended to [b, kv_heads, t + s, d])."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, input_ids, attention_mask, position_ids, caches):
        past = [(caches[2 * i], caches[2 * i + 1]) for i in range(len(caches) // 2)]
        out = self.model(input_ids, attention_mask=attention_mask, position_ids=position_ids, past_key_values=past,
                         use_cache=True, last_only=True)
        return out.logits[:, -1], [t for kv in out.past_key_values for t in kv]


CACHED_FORWARD_INPUTS = ("input_ids", "attention_mask", "position_ids")  # then cache_0 .. cache_{2 x layers - 1}
EXPORT_FORMAT = "kv-cache-v1"  # export.json "format" of a saved CachedForward (tools/export_model.py, predict.py)


def cached_forward_spec(config, dtype: str = "float32") -> list:
    """InputSpecs of CachedForward with every batch, width and cache-length dimension dynamic (None)."""
    ids = [paddle.static.InputSpec([None, None], "int64", name) for name in CACHED_FORWARD_INPUTS]
    caches = [paddle.static.InputSpec([None, config.num_key_value_heads, None, config.head_dim], dtype, f"cache_{i}")
              for i in range(2 * config.num_hidden_layers)]
    return ids + [caches]


class StaticDecoder:
    """The decode engine's step as a compiled DecodeStep, one program per (slots, cache width)."""

    def __init__(self, model):
        self.model = model
        self.step_layer = DecodeStep(model)
        self._compiled: Dict[Tuple[int, int], object] = {}
        self.routing: Optional[np.ndarray] = None  # MoE: the last step's experts [slots, sparse layers, k]

    def step_routing(self) -> Optional[np.ndarray]:
        return self.routing

    def cache_width(self, prompt_width: int, max_new_tokens: int) -> int:
        """The cache width for prompts of up to `prompt_width` tokens: rounded up so nearby widths share a
        program (the SlotCache's capacity is one less: its scratch column)."""
        need = prompt_width + max_new_tokens + 1
        return -(-need // CACHE_BUCKET) * CACHE_BUCKET

    def load_weights(self, model) -> None:  # the program reads the parameters themselves
        pass

    def compiled(self, batch: int, width: int):
        key = (batch, width)
        if key not in self._compiled:
            cfg = self.model.config
            cache_spec = paddle.static.InputSpec([batch, cfg.num_key_value_heads, width, cfg.head_dim], "float32")
            spec = [paddle.static.InputSpec([batch, 1], "int64"), paddle.static.InputSpec([batch, 1], "int64"),
                    paddle.static.InputSpec([batch, width], "int64"), paddle.static.InputSpec([batch], "int64")]
            spec.append([cache_spec] * (2 * cfg.num_hidden_layers))
            self._compiled[key] = paddle.jit.to_static(self.step_layer.forward, input_spec=spec, full_graph=True)
        return self._compiled[key]

    def step(self, token, cache, column, mask, position):
        """The engine's decode step (see FusedDecoder.step) through the compiled program."""
        flat = [t for kv in cache.pairs() for t in kv]
        logits, flat, *routing = self.compiled(cache.slots, cache.width)(token.unsqueeze(-1), position, mask, column,
                                                                        flat)
        self.routing = routing[0].numpy() if routing else None
        cache.set_pairs([(flat[2 * i], flat[2 * i + 1]) for i in range(len(flat) // 2)])
        return logits
