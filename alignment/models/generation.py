"""Batched generation for left-padded prompts, through the decode engine (engine.py): greedy, temperature,
top-k, top-p, repetition penalty, per-row eos stops; and `generate_without_cache`, the reference the engine is
tested against (the whole sequence recomputed for every token).

Prompts come left-padded ([pad pad a b c]); each row's real tokens go to the engine as its own sequence, so
padding never shifts RoPE and the rows' tokens do not depend on each other.
"""
from __future__ import annotations

from typing import Callable, List, NamedTuple, Optional

import numpy as np
import paddle

from alignment.models.engine import DecodeEngine, DecodeSequence
from alignment.models.sampling import GenerationConfig, block_tokens, next_token

__all__ = ["GenerationConfig", "GenerationOutput", "SampleRows", "generate", "generate_without_cache"]


class GenerationOutput(NamedTuple):
    sequences: paddle.Tensor  # [b, prompt_len + new_len]: the left-padded prompt, then the response
    response_mask: paddle.Tensor  # [b, new_len] int64: 1 for generated tokens up to and including eos
    log_probs: Optional[paddle.Tensor] = None  # [b, new_len] float32 when asked: log softmax(logits / T)[token]
    experts: Optional[paddle.Tensor] = None  # MoE: [b, prompt_len + new_len, sparse layers, k] int64, the experts
    # each fed token was routed to (-1 at padding and at the last token, never fed), for routing replay


class SampleRows(NamedTuple):
    """This process's rows of a batch sampled on several processes: `ids` [b] are their positions in the whole
    batch of `total` rows. Random numbers are drawn for all `total` rows and each process keeps its own, so a
    row's sample does not depend on how the batch was split (one process or many give the same tokens)."""
    ids: paddle.Tensor
    total: int


def prompt_rows(input_ids, attention_mask) -> List[List[int]]:
    """Left-padded [b, P] ids and mask -> each row's real ids."""
    ids, mask = input_ids.numpy(), attention_mask.numpy()
    return [row[m > 0].tolist() for row, m in zip(ids, mask)]


@paddle.no_grad()
def generate(model, input_ids, attention_mask, config: GenerationConfig, static=None,
             rows: Optional[SampleRows] = None, log_prob_temperature: Optional[float] = None, fused: bool = True,
             between_tokens: Optional[Callable[[int], bool]] = None, draft=None) -> GenerationOutput:
    """input_ids / attention_mask [b, prompt_len], left-padded. Stops per row at eos, or at max_new_tokens.

    static: a StaticDecoder (static_decode.py) running the decode steps as a compiled program (the prompts are
    still prefilled eagerly). rows: sample by row position in a batch split over processes (SampleRows); else
    the rows of this batch draw from paddle.rand. log_prob_temperature: also return each drawn token's log-prob
    under the model's logits divided by it (token_log_prob), from the logits the token was drawn from, so no
    second forward pass is needed to score the response. fused: decode a plain float32 model through FusedDecoder
    (fused_decode.py); False keeps the model's own layers. between_tokens: called with the number of tokens drawn
    before each decode step; True when it changed the model's weights (partial rollouts do, keeping the KV cache
    of the earlier tokens). draft: a draft model (draft_model.DraftModel) for speculative decoding, drafting
    config.num_assistant_tokens tokens per verify forward.
    """
    prompts = prompt_rows(input_ids, attention_mask)
    b, longest = len(prompts), max(len(p) for p in prompts)
    capacity = longest + config.max_new_tokens
    if static is not None:
        capacity = static.cache_width(longest, config.max_new_tokens) - 1
    draw = None
    if rows is not None:  # one number per row of the whole batch per token, each process keeping its own
        draw = lambda: paddle.gather(paddle.rand([rows.total]), rows.ids)  # noqa: E731
    engine = DecodeEngine(model, b, capacity, fused=fused, static=static, draw_uniforms=draw,
                          before_decode=between_tokens, prefill_together=True, draft=draft)  # every row starts now
    sequences = [DecodeSequence(p, config, len(p) + config.max_new_tokens, log_prob_temperature=log_prob_temperature)
                 for p in prompts]
    for seq in sequences:
        engine.add(seq)
    while engine.busy():
        engine.step()
    width = max(len(seq.turn) for seq in sequences)
    response = np.full([b, width], config.pad_token_id, dtype="int64")
    response_mask = np.zeros([b, width], dtype="int64")
    log_probs = np.zeros([b, width], dtype="float32")
    for i, seq in enumerate(sequences):
        n = len(seq.turn)
        response[i, :n], response_mask[i, :n], log_probs[i, :n] = seq.turn, 1, seq.turn_log_probs
    return GenerationOutput(paddle.concat([input_ids, paddle.to_tensor(response)], axis=1),
                            paddle.to_tensor(response_mask),
                            paddle.to_tensor(log_probs) if log_prob_temperature is not None else None,
                            recorded_experts(sequences, prompts, input_ids.shape[1], width) if engine.routing else None)


def recorded_experts(sequences, prompts, prompt_len: int, width: int) -> paddle.Tensor:
    """The engine's per-token expert record laid out as generate's sequences [b, prompt_len + width, layers, k]
    (prompts left-padded), -1 where nothing was fed."""
    layers, k = sequences[0].experts[0].shape
    out = np.full([len(sequences), prompt_len + width, layers, k], -1, dtype="int64")
    for i, seq in enumerate(sequences):
        start = prompt_len - len(prompts[i])  # the prompt's first column
        out[i, start:start + len(seq.experts)] = np.stack(seq.experts)
    return paddle.to_tensor(out)


@paddle.no_grad()
def generate_without_cache(model, input_ids, attention_mask, config: GenerationConfig) -> GenerationOutput:
    """The reference `generate` is tested against: greedy or sampled (paddle.rand per step) decoding that runs
    the whole sequence through the model for every token, no cache."""
    b = input_ids.shape[0]
    attention_mask = attention_mask.astype("int64")
    sequences, tokens = input_ids, []
    finished = np.zeros([b], bool)
    for step in range(config.max_new_tokens):
        logits = model(sequences, attention_mask=attention_mask, last_only=True).logits[:, -1]
        if step < config.min_new_tokens and config.eos_ids:
            logits = block_tokens(logits, config.eos_ids, paddle.ones([b], "bool"))
        seen = None
        if config.repetition_penalty != 1.0:  # every real token so far
            seen = paddle.put_along_axis(paddle.zeros([b, logits.shape[-1]]), sequences,
                                         attention_mask.astype("float32"), axis=1, reduce="add") > 0
        token = next_token(logits, config, seen, paddle.rand([b])).numpy()
        token = np.where(finished, config.pad_token_id, token)
        tokens.append(token)
        finished |= np.isin(token, config.eos_ids)
        if finished.all():
            break
        sequences = paddle.concat([sequences, paddle.to_tensor(token).unsqueeze(-1)], axis=1)
        attention_mask = paddle.concat([attention_mask, paddle.ones([b, 1], "int64")], axis=1)
    response = np.stack(tokens, axis=1)  # [b, new_len]
    alive = np.concatenate([np.ones([b, 1], bool), ~np.isin(response, config.eos_ids)[:, :-1]], axis=1)
    mask = np.cumprod(alive, axis=1).astype("int64")
    return GenerationOutput(paddle.concat([input_ids, paddle.to_tensor(response)], axis=1), paddle.to_tensor(mask))
