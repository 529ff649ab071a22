"""Advantage estimators, registered by name (`advantage_estimator`; alignment/config/registry.py). An estimator
turns a scored rollout (end rewards, old and reference log-probs, old values) into per-token advantages, and says
what it needs, so neither the arguments nor the trainer ask which one they have. The math is algorithms.py's.

Adding one is one class here (or in any module the run imports) plus its golden test::

    class Halved(AdvantageEstimator):
        NAME = "halved"
        min_group_size = 2
        uses_old_log_probs = False

        def __call__(self, rollout, ppo, reduce_sum):
            per_response = 0.5 * rl.dr_grpo_advantages(rollout.end_rewards, ppo.num_return_sequences)  # [N]
            return rl.broadcast_sequence_advantages(per_response, rollout.response_mask), None
"""
from __future__ import annotations

import math

from alignment.config.registry import ADVANTAGE_ESTIMATORS, Registered
from alignment.ppo import algorithms as rl
from alignment.ppo.kl import kl_estimate


class AdvantageEstimator(Registered, registry=ADVANTAGE_ESTIMATORS):
    """__call__(rollout, ppo, reduce_sum) -> (advantages [N, R], returns [N, R] for the critic or None); rollout:
    the scored rollout (alignment/ppo/rollout.py), ppo: the PPO arguments, reduce_sum: sums a tensor over the
    data-parallel processes (for whole-batch statistics)."""

    needs_critic = False  # a value model is built and trained; the rollout carries its old values
    min_group_size = 1  # the smallest num_return_sequences (2: compares the responses to one prompt)
    uses_old_log_probs = True  # the advantages read the rollout's old log-probs (e.g. the KL in the reward)

    def __call__(self, rollout, ppo, reduce_sum):
        raise NotImplementedError


def kl_in_reward(ppo) -> float:
    """The KL penalty's weight in the per-token reward (0 when it is a loss term instead)."""
    return 0.0 if ppo.kl_in_loss else ppo.kl_coeff


class GAE(AdvantageEstimator):
    """PPO's generalised advantage estimation (Schulman et al. 2016, arXiv 1506.02438) over the KL-penalised
    token rewards, whitened over the batch when normalize_advantage."""

    NAME = "gae"
    needs_critic = True

    def __call__(self, rollout, ppo, reduce_sum):
        mask = rollout.response_mask
        rewards, _ = rl.reward_with_kl(rollout.end_rewards, rollout.old_log_probs, rollout.ref_log_probs, mask,
                                       kl_in_reward(ppo), math.inf, kl_estimate(ppo.kl_estimator))  # [N, R]
        advantages, returns = rl.compute_gae(rollout.old_values, rewards, mask, ppo.gamma, ppo.gae_lambda)
        if ppo.normalize_advantage:
            advantages = rl.masked_whiten(advantages, mask, reduce_sum=reduce_sum)
        return advantages, returns


class ReinforcePlusPlus(AdvantageEstimator):
    """REINFORCE++ (Hu 2025, arXiv 2501.03262): whitened returns-to-go of the KL-penalised token rewards."""

    NAME = "reinforce_plus_plus"

    def __call__(self, rollout, ppo, reduce_sum):
        return rl.reinforce_plus_plus_advantages(rollout.end_rewards, rollout.old_log_probs, rollout.ref_log_probs,
                                                 rollout.response_mask, kl_in_reward(ppo), ppo.gamma,
                                                 kl_estimate(ppo.kl_estimator), reduce_sum), None


class GroupEstimator(AdvantageEstimator):
    """One advantage per response from the end rewards of its prompt's group, spread over its tokens."""

    uses_old_log_probs = False

    @staticmethod
    def per_response(rewards, group_size):
        """rewards [N] (group by group) -> advantages [N]."""
        raise NotImplementedError

    def __call__(self, rollout, ppo, reduce_sum):
        per_response = self.per_response(rollout.end_rewards, ppo.num_return_sequences)  # [N]
        return rl.broadcast_sequence_advantages(per_response, rollout.response_mask), None  # [N, R]


class GRPO(GroupEstimator):
    NAME = "grpo"
    min_group_size = 2
    per_response = staticmethod(rl.grpo_advantages)


class DrGRPO(GroupEstimator):
    NAME = "dr_grpo"
    per_response = staticmethod(rl.dr_grpo_advantages)


class RLOO(GroupEstimator):
    NAME = "rloo"
    min_group_size = 2
    per_response = staticmethod(rl.rloo_advantages)


class ReinforceBaseline(GroupEstimator):
    NAME = "reinforce_baseline"
    per_response = staticmethod(rl.reinforce_baseline_advantages)
