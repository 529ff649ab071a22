"""The actor's loss for one micro-batch, composed from the pure functions of algorithms.py as the PPO arguments
ask: PPO's token-ratio surrogate (symmetric, or DAPO's clip-higher) or GSPO's sequence ratio, aggregated by
`loss_agg_mode`, weighted by `pg_loss_coeff`, plus the KL terms (`kl_in_loss`: kl_coeff x token-mean KL;
`kl_loss_coeff`: a KL loss aggregated like the policy loss) and minus `entropy_coeff` x the aggregated entropy.

With the default arguments this is exactly `algorithms.policy_objective` (PPO, clip_range_ratio both ways,
token-mean). `step_weights` says what each micro-batch's loss is a mean over, so a micro-batch's share of the
optimizer step's loss is its share of those units over every micro-batch and data rank.
"""
from __future__ import annotations

from typing import Dict, Tuple

from alignment.ppo import algorithms as rl


def uses_defaults(ppo) -> bool:
    return (ppo.policy_loss_mode == "ppo" and ppo.loss_agg_mode == "token-mean" and ppo.pg_loss_coeff == 1.0
            and ppo.entropy_coeff == 0.0 and ppo.kl_loss_coeff == 0.0 and ppo.clip_range_ratio_low is None
            and ppo.clip_range_ratio_high is None)


def aggregation(ppo) -> str:
    """The loss aggregation in effect (GSPO's loss is always a mean of per-sequence means)."""
    return "seq-mean-token-mean" if ppo.policy_loss_mode == "gspo" else ppo.loss_agg_mode


def step_weight(ppo, mask) -> float:
    """What a micro-batch's loss averages over: its response tokens (token-mean) or its responses with at least one
    token (the seq-mean modes). mask: [n, R]."""
    mask = mask.astype("float32")
    if aggregation(ppo) == "token-mean":
        return float(mask.sum())
    return float((mask.sum(axis=1) > 0).astype("float32").sum())


def actor_objective(ppo, log_probs, old_log_probs, advantages, mask, ref_log_probs, entropy,
                    max_response_len: int) -> Tuple[object, Dict[str, object]]:
    """(scalar loss, {stat: scalar}) for one micro-batch; every tensor [n, R]. entropy: per-token entropies, in the
    autograd graph when entropy_coeff > 0. max_response_len: Dr.GRPO's constant (seq-mean-token-sum-norm)."""
    if uses_defaults(ppo):
        return rl.policy_objective(log_probs, old_log_probs, advantages, mask, ref_log_probs, ppo.clip_range_ratio,
                                   ppo.kl_coeff if ppo.kl_in_loss else None, ppo.kl_estimator)
    low = ppo.clip_range_ratio if ppo.clip_range_ratio_low is None else ppo.clip_range_ratio_low
    high = ppo.clip_range_ratio if ppo.clip_range_ratio_high is None else ppo.clip_range_ratio_high
    mode, constant = aggregation(ppo), max_response_len
    if ppo.policy_loss_mode == "gspo":
        loss, stats = rl.gspo_policy_loss_and_stats(log_probs, old_log_probs, advantages, mask, low, high)
    else:
        loss, stats = rl.asymmetric_policy_loss_and_stats(log_probs, old_log_probs, advantages, mask, low, high,
                                                          mode, constant)
    loss = ppo.pg_loss_coeff * loss
    stats = {**stats, "pg_loss": loss.detach()}
    if ppo.kl_in_loss:
        loss = loss + ppo.kl_coeff * rl.masked_mean(rl.kl_penalty(log_probs, ref_log_probs, ppo.kl_estimator), mask)
    if ppo.kl_loss_coeff > 0:
        kl = rl.kl_loss(log_probs, ref_log_probs, mask, ppo.kl_loss_estimator, mode, constant)
        loss = loss + ppo.kl_loss_coeff * kl
        stats["kl_loss"] = kl.detach()
    if ppo.entropy_coeff > 0:
        loss, stats["entropy_bonus"] = rl.entropy_bonus_loss(loss, entropy, mask, ppo.entropy_coeff, mode, constant)
    return loss, stats
