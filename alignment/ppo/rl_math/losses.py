"""Policy losses, registered by name (`policy_loss_mode`; alignment/config/registry.py). Each clips its ratio
with the one clipped loss of surrogate.py and reports its statistics; objective.py adds the KL and entropy terms.
"""
from __future__ import annotations

from typing import Dict, Optional, Tuple

from alignment.config.registry import POLICY_LOSSES, Registered
from alignment.ppo.rl_math import surrogate as sur


class PolicyLoss(Registered, registry=POLICY_LOSSES):
    """__call__(log_probs, old_log_probs, advantages, mask, low, high, loss_agg_mode, loss_agg_constant,
    split_stats) -> (scalar loss, {stat: detached scalar}); tensors [n, R], ratios clipped to [1 - low, 1 + high].
    split_stats: report clip_frac_low / clip_frac_high beside clip_frac (else PPO's symmetric clip_frac)."""

    aggregation: Optional[str] = None  # the loss_agg_mode the loss always uses (None: the loss_agg_mode key's)

    def __call__(self, log_probs, old_log_probs, advantages, mask, low: float, high: float, loss_agg_mode: str,
                 loss_agg_constant: Optional[float], split_stats: bool) -> Tuple[object, Dict[str, object]]:
        raise NotImplementedError


class TokenRatioLoss(PolicyLoss):
    """PPO / GRPO / DAPO: each token's ratio clipped."""

    NAME = "ppo"

    def __call__(self, log_probs, old_log_probs, advantages, mask, low, high, loss_agg_mode, loss_agg_constant,
                 split_stats):
        ratio, log_ratio = sur.token_ratio(log_probs, old_log_probs, mask)  # [n, R], [n, R]
        loss = sur.clipped_policy_loss(ratio, advantages, mask, low, high, loss_agg_mode, loss_agg_constant)
        if split_stats:
            return loss, sur.ratio_clip_stats(ratio, log_ratio, mask, low, high)
        return loss, sur.ppo_ratio_stats(ratio, log_ratio, mask, low)


class SequenceRatioLoss(PolicyLoss):
    """GSPO: one length-normalised ratio per sequence, clipped per sequence; always seq-mean-token-mean."""

    NAME = "gspo"
    aggregation = "seq-mean-token-mean"

    def __call__(self, log_probs, old_log_probs, advantages, mask, low, high, loss_agg_mode, loss_agg_constant,
                 split_stats):
        ratio, seq_log_ratio, log_ratio = sur.gspo_ratio(log_probs, old_log_probs, mask)  # [n, R], [n], [n, R]
        loss = sur.clipped_policy_loss(ratio, advantages, mask, low, high, self.aggregation)
        return loss, sur.gspo_ratio_stats(seq_log_ratio, log_ratio, mask, low, high)
