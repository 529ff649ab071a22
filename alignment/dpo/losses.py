"""Offline preference losses as pure functions: DPO and its variants, and KTO.

Inputs are per-sequence log-probabilities, already summed over the response tokens (prompt and padding
excluded; see `alignment.dpo.trainer.sequence_log_probs`), with the token counts where a variant averages.
Every function returns (losses [b], chosen_rewards [b], rejected_rewards [b]); rewards are the implicit
rewards beta * (log pi - log pi_ref), detached, for logging.
"""
from __future__ import annotations

import paddle
import paddle.nn.functional as F

from alignment.config.choices import PAIRED_LOSS_TYPES


def preference_loss(policy_chosen, policy_rejected, ref_chosen, ref_rejected, chosen_tokens, rejected_tokens,
                    loss_type: str = "sigmoid", beta: float = 0.1, label_smoothing: float = 0.0,
                    simpo_gamma: float = 0.5):
    """Pairwise losses; all inputs [b] (log-probs summed over response tokens; token counts as float).

    sigmoid (DPO):  h = (pc - pr) - (rc - rr);  -(1 - ls) log s(beta h) - ls log s(-beta h)   (ls > 0: cDPO)
    ipo:            h as above on token-averaged log-probs (as TRL);  (h - 1 / (2 beta))^2
    hinge:          relu(1 - beta h)                      (SLiC)
    simpo:          reference-free, token-averaged:  -(1 - ls) log s(beta (pc/|c| - pr/|r|) - gamma) - ls log s(-...)
    """
    if loss_type == "simpo":
        logits = beta * (policy_chosen / chosen_tokens - policy_rejected / rejected_tokens) - simpo_gamma  # [b]
        losses = -(1 - label_smoothing) * F.log_sigmoid(logits) - label_smoothing * F.log_sigmoid(-logits)
        chosen_rewards = beta * policy_chosen / chosen_tokens
        rejected_rewards = beta * policy_rejected / rejected_tokens
        return losses, chosen_rewards.detach(), rejected_rewards.detach()
    chosen_ratio = policy_chosen - ref_chosen  # [b]: log pi(c) / pi_ref(c)
    rejected_ratio = policy_rejected - ref_rejected  # [b]
    if loss_type == "sigmoid":
        logits = beta * (chosen_ratio - rejected_ratio)
        losses = -(1 - label_smoothing) * F.log_sigmoid(logits) - label_smoothing * F.log_sigmoid(-logits)
    elif loss_type == "ipo":
        margin = chosen_ratio / chosen_tokens - rejected_ratio / rejected_tokens
        losses = (margin - 1.0 / (2.0 * beta)) ** 2
    elif loss_type == "hinge":
        losses = F.relu(1.0 - beta * (chosen_ratio - rejected_ratio))
    else:
        raise ValueError(f"unknown paired loss_type {loss_type!r}; expected one of {PAIRED_LOSS_TYPES}")
    return losses, (beta * chosen_ratio).detach(), (beta * rejected_ratio).detach()


def kto_kl_estimate(policy_mismatched, ref_mismatched):
    """KTO's reference point z0: the batch mean of log pi - log pi_ref on mismatched (prompt, completion) rows,
    clamped at 0 and detached (as in the paper and TRL). Inputs [m] -> scalar."""
    return paddle.clip((policy_mismatched - ref_mismatched).mean(), min=0.0).detach()


def kto_loss(policy_logps, ref_logps, desirable, kl, beta: float = 0.1, desirable_weight: float = 1.0,
             undesirable_weight: float = 1.0):
    """KTO on unpaired rows. policy_logps, ref_logps [b] (summed over response tokens); desirable [b] bool;
    kl: scalar reference point (kto_kl_estimate).

    desirable:    w_d (1 - s(beta (log ratio - kl)))
    undesirable:  w_u (1 - s(beta (kl - log ratio)))
    Returns (losses [b], rewards of desirable rows [b], rewards of undesirable rows [b]); the reward of a row of
    the other kind is 0 (use the masks to average).
    """
    ratio = policy_logps - ref_logps  # [b]
    want = desirable.astype(ratio.dtype)  # [b]
    desirable_losses = desirable_weight * (1 - F.sigmoid(beta * (ratio - kl)))
    undesirable_losses = undesirable_weight * (1 - F.sigmoid(beta * (kl - ratio)))
    losses = want * desirable_losses + (1 - want) * undesirable_losses
    rewards = (beta * ratio).detach()
    return losses, rewards * want, rewards * (1 - want)
