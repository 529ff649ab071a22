"""Pairwise reward-model losses (safe-rlhf's), as pure functions.

sequence-wise: -log sigmoid(r_better - r_worse) on the end scores.
token-wise:    per pair, the mean of -log sigmoid(s_better[t] - s_worse[t]) over t from the first token where the
               two sequences differ to the later of their two last tokens; then the mean over pairs.
Both add `regularization * mean(r_better^2 + r_worse^2) / 2`, keeping scores near zero.
"""
from __future__ import annotations

import paddle
import paddle.nn.functional as F

from alignment.models.score_model import last_token_index


def score_regularization(better_end, worse_end, regularization: float):
    """regularization * mean over both sides of the squared end scores ([b] each -> scalar)."""
    return regularization * paddle.concat([better_end, worse_end]).square().mean()


def sequence_wise_loss(better_end, worse_end, regularization: float = 0.0):
    """better_end, worse_end: [b] end scores -> scalar."""
    loss = -F.log_sigmoid(better_end - worse_end).mean()
    return loss + score_regularization(better_end, worse_end, regularization) if regularization > 0 else loss


def divergence_mask(better_ids, worse_ids, better_mask, worse_mask):
    """[b, s] float mask: 1 from the first differing column to max(last real token of either side)."""
    s = better_ids.shape[1]
    columns = paddle.arange(s).unsqueeze(0)  # [1, s]
    differs = (better_ids != worse_ids).astype("int32")  # [b, s]
    if not bool(differs.any(axis=1).all()):
        raise ValueError("a preference pair has identical better and worse token sequences")
    first_diff = paddle.argmax(differs, axis=1).unsqueeze(1)  # [b, 1]
    end = paddle.maximum(last_token_index(better_mask), last_token_index(worse_mask)).unsqueeze(1)  # [b, 1]
    return ((columns >= first_diff) & (columns <= end)).astype("float32")


def token_wise_loss(better_scores, worse_scores, better_end, worse_end, better_ids, worse_ids, better_mask,
                    worse_mask, regularization: float = 0.0):
    """better_scores, worse_scores, ids, masks: [b, s] (same padded width); *_end: [b] -> scalar."""
    span = divergence_mask(better_ids, worse_ids, better_mask, worse_mask)  # [b, s]
    per_token = -F.log_sigmoid(better_scores - worse_scores)  # [b, s]
    per_pair = (per_token * span).sum(axis=1) / span.sum(axis=1)  # [b]
    loss = per_pair.mean()
    return loss + score_regularization(better_end, worse_end, regularization) if regularization > 0 else loss
