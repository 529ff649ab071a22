"""Advantage estimators, registered by name (`advantage_estimator`; alignment/config/registry.py). An estimator
turns a scored rollout (end rewards, old and reference log-probs, old values) into per-token advantages, and says
what it needs, so neither the arguments nor the trainer ask which one they have. Pure math on paddle tensors with
the building blocks of algorithms.py.

Adding one is one class here (or in any module the run imports) plus its golden test::

    class Halved(AdvantageEstimator):
        NAME = "halved"
        min_group_size = 2
        uses_old_log_probs = False

        def __call__(self, rollout, ppo, reduce_sum):
            _, centered = rl.centered_groups(rollout.end_rewards, ppo.num_return_sequences)  # [P, G]
            per_response = 0.5 * centered.reshape([-1])  # [N]
            return rl.broadcast_sequence_advantages(per_response, rollout.response_mask), None
"""
from __future__ import annotations

import math

import paddle

from alignment.config.registry import ADVANTAGE_ESTIMATORS, Registered
from alignment.ppo.rl_math import algorithms as rl
from alignment.ppo.rl_math.kl import kl_estimate


class AdvantageEstimator(Registered, registry=ADVANTAGE_ESTIMATORS):
    """__call__(rollout, ppo, reduce_sum) -> (advantages [N, R], returns [N, R] for the critic or None); rollout:
    the scored rollout (alignment/ppo/rollout/rollout.py), ppo: the PPO arguments, reduce_sum: sums a tensor over the
    data-parallel processes (for whole-batch statistics)."""

    needs_critic = False  # a value model is built and trained; the rollout carries its old values
    min_group_size = 1  # the smallest num_return_sequences (2: compares the responses to one prompt)
    uses_old_log_probs = True  # the advantages read the rollout's old log-probs (e.g. the KL in the reward)
    token_level_rewards = False  # reads per-token rewards (a multi-turn episode's per-turn rewards)
    policy_gradient = True  # its advantages move the policy on the sampled answers (False: zero advantages)
    # critic estimators: critic_returns(rollout, ppo) -> the critic's targets [N, R] from the rollout's old values,
    # row by row (no statistic over the batch), so the update's first critic pass can give both (critic.py); None:
    # the critic scores the rollout in a pass of its own first
    critic_returns = None

    def __call__(self, rollout, ppo, reduce_sum):
        raise NotImplementedError


def kl_in_reward(ppo) -> float:
    """The KL penalty's weight in the per-token reward (0 when it is a loss term instead)."""
    return 0.0 if ppo.kl_in_loss else ppo.kl_coeff


def token_rewards(rollout, kl_coeff: float, kl_estimator: str):
    """Per-token rewards [N, R]: -kl_coeff * KL_t, the end reward on each row's last policy token; with a
    multi-turn rollout's per-turn rewards, each turn's on its last token (and the end reward without them)."""
    end = rollout.end_rewards  # [N]
    if rollout.turn_rewards is not None:
        end = end - rollout.turn_rewards.sum(axis=1)  # [N]: what the reward model / functions gave
    rewards, _ = rl.reward_with_kl(end, rollout.old_log_probs, rollout.ref_log_probs, rollout.response_mask,
                                   kl_coeff, math.inf, kl_estimate(kl_estimator))  # [N, R]
    return rewards if rollout.turn_rewards is None else rewards + rollout.turn_rewards


class GAE(AdvantageEstimator):
    """PPO's generalised advantage estimation (Schulman et al. 2016, arXiv 1506.02438) over the KL-penalised
    token rewards, whitened over the batch when normalize_advantage."""

    NAME = "gae"
    needs_critic = True
    token_level_rewards = True

    def __call__(self, rollout, ppo, reduce_sum):
        advantages, returns = self.gae(rollout, ppo)  # [N, R] each
        if ppo.normalize_advantage:
            advantages = rl.masked_whiten(advantages, rollout.response_mask, reduce_sum=reduce_sum)
        return advantages, returns

    def critic_returns(self, rollout, ppo):
        return self.gae(rollout, ppo)[1]  # [N, R]

    @staticmethod
    def gae(rollout, ppo):
        rewards = token_rewards(rollout, kl_in_reward(ppo), ppo.kl_estimator)  # [N, R]
        return rl.compute_gae(rollout.old_values, rewards, rollout.response_mask, ppo.gamma, ppo.gae_lambda)


class VAPO(AdvantageEstimator):
    """VAPO (Yue et al. 2025, arXiv 2504.05118): PPO with decoupled GAE, the critic's returns with lambda 1
    (unbiased targets for its long-horizon values) and the policy's advantages with the length-adaptive lambda
    1 - 1 / (vapo_length_alpha * response length), whitened when normalize_advantage. Its value pretraining is
    pretrain_critic_steps; clip-higher and the token-mean loss are the clip_range_ratio_high / loss_agg_mode keys."""

    NAME = "vapo"
    needs_critic = True
    token_level_rewards = True

    def __call__(self, rollout, ppo, reduce_sum):
        mask = rollout.response_mask
        rewards = token_rewards(rollout, kl_in_reward(ppo), ppo.kl_estimator)  # [N, R]
        lam = rl.length_adaptive_lambda(mask.sum(axis=1), ppo.vapo_length_alpha)  # [N]
        advantages, _ = rl.compute_gae(rollout.old_values, rewards, mask, ppo.gamma, lam)  # [N, R]
        if ppo.normalize_advantage:
            advantages = rl.masked_whiten(advantages, mask, reduce_sum=reduce_sum)
        return advantages, self.returns(rollout, rewards, ppo)

    def critic_returns(self, rollout, ppo):
        return self.returns(rollout, token_rewards(rollout, kl_in_reward(ppo), ppo.kl_estimator), ppo)  # [N, R]

    @staticmethod
    def returns(rollout, rewards, ppo):
        """The critic's targets [N, R]: GAE with lambda 1 over the token rewards [N, R]."""
        return rl.compute_gae(rollout.old_values, rewards, rollout.response_mask, ppo.gamma, 1.0)[1]


class ReinforcePlusPlus(AdvantageEstimator):
    """REINFORCE++ (Hu 2025, arXiv 2501.03262): whitened returns-to-go of the KL-penalised token rewards."""

    NAME = "reinforce_plus_plus"
    token_level_rewards = True

    def __call__(self, rollout, ppo, reduce_sum):
        rewards = token_rewards(rollout, kl_in_reward(ppo), ppo.kl_estimator)  # [N, R]
        return rl.whitened_returns(rewards, rollout.response_mask, ppo.gamma, reduce_sum), None


class GroupEstimator(AdvantageEstimator):
    """One advantage per response from the end rewards of its prompt's group, spread over its tokens."""

    uses_old_log_probs = False

    @classmethod
    def per_response(cls, rewards, group_size):
        """rewards [N], ordered group by group (each prompt's group_size samples contiguous) -> advantages [N]."""
        raise NotImplementedError

    @classmethod
    def groups(cls, rewards, group_size):
        """(rewards [P, G], rewards minus their group's mean [P, G]); ValueError unless whole groups of at least
        min_group_size."""
        if group_size < cls.min_group_size:
            raise ValueError(f"{cls.NAME} needs num_return_sequences >= {cls.min_group_size}, got {group_size}")
        return rl.centered_groups(rewards, group_size)

    def __call__(self, rollout, ppo, reduce_sum):
        per_response = self.per_response(rollout.end_rewards, ppo.num_return_sequences)  # [N]
        return rl.broadcast_sequence_advantages(per_response, rollout.response_mask), None  # [N, R]


class GRPO(GroupEstimator):
    """GRPO (Shao et al. 2024, arXiv 2402.03300): (r - mean_g) / (std_g + eps), std with ddof=1."""

    NAME = "grpo"
    min_group_size = 2

    @classmethod
    def per_response(cls, rewards, group_size, eps=1e-6):
        grouped, centered = cls.groups(rewards, group_size)  # [P, G], [P, G]
        return (centered / (rl.sample_std(grouped, axis=1, keepdim=True) + eps)).reshape([-1])  # [N]


class DrGRPO(GroupEstimator):
    """Dr.GRPO (Liu et al. 2025, arXiv 2503.20783): r - mean_g, no division by the std (0 for groups of 1)."""

    NAME = "dr_grpo"

    @classmethod
    def per_response(cls, rewards, group_size):
        return cls.groups(rewards, group_size)[1].reshape([-1])  # [N]


class RLOO(GroupEstimator):
    """RLOO (Ahmadian et al. 2024, arXiv 2402.14740): r - the mean of the other G - 1 rewards of the group
    = (G r - sum_g) / (G - 1)."""

    NAME = "rloo"
    min_group_size = 2

    @classmethod
    def per_response(cls, rewards, group_size):
        _, centered = cls.groups(rewards, group_size)  # [P, G]
        return (centered * group_size / (group_size - 1)).reshape([-1])  # [N]


class ReinforceBaseline(GroupEstimator):
    """REINFORCE with the group mean as baseline (OpenRLHF's reinforce_baseline): (r - mean_g) / (std over the
    whole batch of r - mean_g, ddof=1, + eps); 0 for groups of 1."""

    NAME = "reinforce_baseline"

    @classmethod
    def per_response(cls, rewards, group_size, eps=1e-6):
        _, centered = cls.groups(rewards, group_size)  # [P, G]
        return (centered / (rl.sample_std(centered) + eps)).reshape([-1])  # [N]


class NoAdvantage(AdvantageEstimator):
    """Zero advantages, no critic: the policy learns from other terms only (a teacher's distillation loss or
    advantage, alignment-distill's default). Rewards are still computed and logged."""

    NAME = "none"
    uses_old_log_probs = False
    policy_gradient = False

    def __call__(self, rollout, ppo, reduce_sum):
        return paddle.zeros_like(rollout.response_mask.astype("float32")), None  # [N, R]
