"""Speculative decoding's math: the prompt-lookup drafter and the acceptance rules that keep the output exact.

A draft of k tokens is proposed after a sequence's last sampled token, the policy runs the token and the draft in
one forward (speculative_step.py), and position j's logits give the policy's distribution p_j for draft token j:
- greedy: draft tokens are accepted while each equals the argmax of its position (the tokens plain greedy decoding
  would give), and the next token is the argmax after the last accepted one;
- sampled (Leviathan et al. 2023, Chen et al. 2023): draft token x drawn from q is accepted with probability
  min(1, p(x) / q(x)); at the first rejection the next token is drawn from norm(max(0, p - q)); when all are
  accepted a bonus token is drawn from p after the last. Each emitted token is then distributed as p exactly.
  A prompt-lookup draft is deterministic, q a point mass on x: x is accepted with probability p(x), and after a
  rejection the token is drawn from p with x left out, renormalised (sampling.next_token's `excluded`).
  A draft model's tokens are drawn from its own sampling distribution q (draft_model.py), and the general rule
  applies: accepted with probability min(1, p(x) / q(x)), the next token after a rejection from norm(max(0, p - q)).
p is the policy's sampling distribution (sampling.sampling_logits: repetition penalty, temperature, top-k, top-p,
eos blocked before min_new_tokens), so the filters see the same logits a one-token step gives them.
"""
from __future__ import annotations

from typing import List, Optional, Sequence

import numpy as np
import paddle
import paddle.nn.functional as F

from alignment.models.sampling import GenerationConfig, block_tokens, sampling_logits


def prompt_lookup(ids: Sequence[int], k: int, max_n: int, min_n: int = 1) -> List[int]:
    """Up to k ids that followed the earliest earlier occurrence of the longest n-gram (max_n down to min_n ids)
    ending `ids`; [] when none occurs (HF's prompt_lookup_num_tokens / max_matching_ngram_size, vLLM's
    prompt_lookup_max / prompt_lookup_min). The draft may run into the n-gram itself, up to the last id."""
    tokens = np.asarray(ids, dtype="int64")
    total = len(tokens)
    if k <= 0:
        return []
    for n in range(min(max_n, total - 1), min_n - 1, -1):
        windows = np.lib.stride_tricks.sliding_window_view(tokens[:total - 1], n)  # [total - n, n]: not the end's
        hits = np.flatnonzero((windows == tokens[total - n:]).all(axis=1))
        if hits.size:
            start = int(hits[0]) + n
            return tokens[start:start + k].tolist()
    return []


def acceptance_probability(p, q, x):
    """p, q [b, vocab] the verifier's and the drafter's distributions, x [b] the drafted tokens -> [b]:
    min(1, p(x) / q(x)), the probability of keeping x."""
    px = paddle.take_along_axis(p, x.unsqueeze(-1), axis=-1).squeeze(-1)  # [b]
    qx = paddle.take_along_axis(q, x.unsqueeze(-1), axis=-1).squeeze(-1)  # [b]
    return paddle.minimum(paddle.ones_like(px), px / qx)


def residual_distribution(p, q):
    """p, q [b, vocab] -> norm(max(0, p - q)) [b, vocab]: what the token after a rejected draft token is drawn
    from. With q a point mass on x: p with x left out, renormalised."""
    rest = paddle.clip(p - q, min=0.0)  # [b, vocab]
    return rest / rest.sum(axis=-1, keepdim=True)


def filtered_probabilities(logits):
    """logits [n, vocab] sampling logits (filtered tokens at -inf) -> softmax [n, vocab] with the filtered tokens
    at 0 exactly (Paddle's softmax gives -inf a weight of ~1e-28), so no draw and no residual can reach them."""
    return paddle.where(paddle.isfinite(logits), F.softmax(logits, axis=-1), paddle.zeros_like(logits))


def rejection_distribution(p, q):
    """p, q [n, vocab] -> [n, vocab]: norm(max(0, p - q)), what the token after a draft model's rejected token is
    drawn from; p itself in a row where p <= q everywhere (p equals q up to rounding, so a rejection there had
    probability ~1e-7 and max(0, p - q) sums to 0)."""
    rest = paddle.clip(p - q, min=0.0)  # [n, vocab]
    total = rest.sum(axis=-1, keepdim=True)  # [n, 1]
    return paddle.where(total > 0, rest / paddle.where(total > 0, total, paddle.ones_like(total)), p)


def ratio_agreement(p, q, draft, uniform: np.ndarray) -> np.ndarray:
    """p, q [b k, vocab] the policy's and the draft model's distributions at each draft position, draft [b k] the
    tokens drawn from q, uniform [b, k] in [0, 1) -> keep [b, k] bool: True with probability min(1, p(x) / q(x))."""
    accept = acceptance_probability(p, q, draft).numpy().reshape(uniform.shape)  # [b, k]; NaN at padding (q = 0)
    return uniform < np.nan_to_num(accept, nan=0.0)


def draw_from(probs, uniform):
    """probs [b, vocab] (rows sum to 1 up to rounding), uniform [b] in [0, 1) -> ids [b]: the first token whose
    cumulative probability exceeds uniform * total (a token of probability 0 is never the first)."""
    cdf = paddle.cumsum(probs, axis=-1)  # [b, vocab]
    target = uniform.unsqueeze(-1) * cdf[:, -1:]  # [b, 1]
    return paddle.minimum(paddle.searchsorted(cdf, target, right=True).squeeze(-1),
                          paddle.full([probs.shape[0]], probs.shape[-1] - 1, "int64"))


def draft_probabilities(logits, tokens):
    """logits [n, vocab] a position's sampling logits (filtered tokens at -inf), tokens [n] the drafted ones ->
    (p(token) [n], sole [n] bool: the token is the only one the filters left, so a rejection has nothing to draw).
    A filtered token's p is 0 exactly (Paddle's softmax gives -inf a weight of ~1e-28)."""
    p = paddle.take_along_axis(F.softmax(logits, axis=-1), tokens.unsqueeze(-1), axis=-1).squeeze(-1)  # [n]
    kept = paddle.isfinite(paddle.take_along_axis(logits, tokens.unsqueeze(-1), axis=-1).squeeze(-1))  # [n]
    alive = paddle.isfinite(logits).astype("int64").sum(axis=-1)  # [n]
    return paddle.where(kept, p, paddle.zeros_like(p)), (alive == 1) & kept


def greedy_agreement(draft: np.ndarray, choice: np.ndarray) -> np.ndarray:
    """draft [b, k], choice [b, k] the verifier's argmax at each draft position -> keep [b, k] bool."""
    return draft == choice


def point_mass_agreement(p_draft: np.ndarray, uniform: np.ndarray, sole: np.ndarray) -> np.ndarray:
    """p_draft [b, k] the verifier's probability of each (deterministic) draft token, uniform [b, k] in [0, 1),
    sole [b, k] -> keep [b, k] bool: True with probability p(x) (min(1, p / q) for q(x) = 1)."""
    return (uniform < p_draft) | sole


def accepted_lengths(keep: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """keep [b, k] bool per draft position, lengths [b] each row's draft length (the rest is padding) ->
    accepted [b]: the draft tokens before the first one not kept."""
    real = np.arange(keep.shape[1])[None, :] < lengths[:, None]  # [b, k]
    return np.cumprod(keep & real, axis=1).sum(axis=1)


def position_logits(logits, config: GenerationConfig, seen, fed, turn_lengths: np.ndarray):
    """The sampling logits at each draft position. logits [b, k, vocab] after each fed token; fed [b, k] int64 the
    tokens fed up to each position (the sampled token, then the draft); seen [b, vocab] bool the tokens fed before
    them (None without a repetition penalty); turn_lengths [b] the tokens of each row's turn before position 0's
    draft token. -> [b k, vocab]: what sampling.next_token would draw from at each position, eos blocked where the
    turn is still shorter than min_new_tokens."""
    b, k, vocab = logits.shape
    flat = logits.reshape([b * k, vocab])
    under = (turn_lengths[:, None] + np.arange(k)[None, :]) < config.min_new_tokens  # [b, k]
    if config.eos_ids and under.any():
        flat = block_tokens(flat, config.eos_ids, paddle.to_tensor(under.reshape([-1])))
    return sampling_logits(flat, config, seen_at_positions(seen, fed, vocab))


def seen_at_positions(seen, fed, vocab: int) -> Optional[paddle.Tensor]:
    """seen [b, vocab] bool (or None), fed [b, k] -> [b k, vocab]: seen plus the tokens fed up to each position.
    (A prompt-lookup draft and the token before it occur earlier in the sequence, so there it adds nothing to
    seen; a draft model's tokens may be new.)"""
    if seen is None:
        return None
    b, k = fed.shape
    cumulative = paddle.cumsum(F.one_hot(fed, vocab), axis=1) > 0  # [b, k, vocab]
    return (cumulative | seen.unsqueeze(1)).reshape([b * k, vocab])
