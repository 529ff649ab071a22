"""The actor's loss for one micro-batch, composed as the PPO arguments ask, the same in the eager and the pipeline
update: the registered policy loss (`policy_loss_mode`, losses.py: PPO's token ratios with a symmetric or DAPO's
clip-higher range, or GSPO's sequence ratio) aggregated by `loss_agg_mode`, weighted by `pg_loss_coeff`, plus the
KL terms (`kl_in_loss`: kl_coeff x the KL; `kl_loss_coeff`: kl_loss_coeff x a KL loss; both aggregated like the
policy loss, so the step's loss is one mean whatever the split) and minus `entropy_coeff` x the aggregated entropy.
`step_weight` says what each micro-batch's loss is a mean over, so a micro-batch's share of the optimizer step's
loss is its share of those units over every micro-batch and data rank.
"""
from __future__ import annotations

from typing import Dict, Tuple

from alignment.config.registry import POLICY_LOSSES
from alignment.ppo.rl_math import surrogate as sur
from alignment.ppo.rl_math.kl import kl_estimate


def uses_defaults(ppo) -> bool:
    """Plain PPO: none of the DAPO / GSPO / GRPO loss options is set."""
    return (ppo.policy_loss_mode == "ppo" and ppo.loss_agg_mode == "token-mean" and ppo.pg_loss_coeff == 1.0
            and ppo.entropy_coeff == 0.0 and ppo.kl_loss_coeff == 0.0 and ppo.clip_range_ratio_low is None
            and ppo.clip_range_ratio_high is None)


def aggregation(ppo) -> str:
    """The loss aggregation in effect (a policy loss may fix its own, as GSPO's mean of per-sequence means)."""
    return POLICY_LOSSES[ppo.policy_loss_mode].aggregation or ppo.loss_agg_mode


def clip_range(ppo) -> Tuple[float, float]:
    """(low, high): the ratio is clipped to [1 - low, 1 + high]."""
    low = ppo.clip_range_ratio if ppo.clip_range_ratio_low is None else ppo.clip_range_ratio_low
    high = ppo.clip_range_ratio if ppo.clip_range_ratio_high is None else ppo.clip_range_ratio_high
    return low, high


def step_weight(ppo, mask) -> float:
    """What a micro-batch's loss averages over: its response tokens (token-mean) or its responses with at least one
    token (the seq-mean modes). mask: [n, R]."""
    mask = mask.astype("float32")
    if aggregation(ppo) == "token-mean":
        return float(mask.sum())
    return float((mask.sum(axis=1) > 0).astype("float32").sum())


def actor_objective(ppo, log_probs, old_log_probs, advantages, mask, ref_log_probs, entropy,
                    max_response_len: int, distill=None) -> Tuple[object, Dict[str, object]]:
    """(scalar loss, {stat: scalar}) for one micro-batch; every tensor [n, R]. entropy: per-token entropies, in the
    autograd graph when entropy_coeff > 0 (unused otherwise). max_response_len: Dr.GRPO's constant
    (seq-mean-token-sum-norm). Plain PPO reports clip_frac, approx_kl and ratio; with any loss option set the
    statistics add clip_frac_low / clip_frac_high and pg_loss (and kl_loss, entropy_bonus when those are on).
    distill: (distill_coeff, a teacher's per-token divergence [n, R]) or None (teacher.py): + distill_coeff x the
    divergence aggregated like the policy loss (statistic distill_loss: the aggregated divergence)."""
    (low, high), mode, constant = clip_range(ppo), aggregation(ppo), max_response_len
    recipe = not uses_defaults(ppo)
    policy_loss = POLICY_LOSSES[ppo.policy_loss_mode]()
    loss, stats = policy_loss(log_probs, old_log_probs, advantages, mask, low, high, mode, constant, recipe)
    if recipe:
        loss = ppo.pg_loss_coeff * loss
        stats["pg_loss"] = loss.detach()
    if ppo.kl_in_loss:  # aggregated like the policy loss (as TRL's GRPO adds beta x KL to the per-token loss)
        loss = loss + ppo.kl_coeff * sur.kl_loss(log_probs, ref_log_probs, mask, kl_estimate(ppo.kl_estimator), mode,
                                                 constant)
    if ppo.kl_loss_coeff > 0:
        kl = sur.kl_loss(log_probs, ref_log_probs, mask, kl_estimate(ppo.kl_loss_estimator), mode, constant)
        loss = loss + ppo.kl_loss_coeff * kl
        stats["kl_loss"] = kl.detach()
    if distill is not None:
        coeff, divergence = distill
        stats["distill_loss"] = sur.aggregate_loss(divergence, mask, mode, constant)
        loss = loss + coeff * stats["distill_loss"]
        stats["distill_loss"] = stats["distill_loss"].detach()
    if ppo.entropy_coeff > 0:
        loss, stats["entropy_bonus"] = sur.entropy_bonus_loss(loss, entropy, mask, ppo.entropy_coeff, mode,
                                                              constant)
    return loss, stats
