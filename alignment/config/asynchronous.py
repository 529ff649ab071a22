"""Asynchronous RL arguments: rollout ranks beside the training ranks, bounded staleness, the rollout ledger."""
from __future__ import annotations

import dataclasses

from alignment.config.parser import field
from alignment.config.ppo import PPOArguments


@dataclasses.dataclass
class AsyncArguments:
    """Rollout ranks generate while the training ranks train (alignment/ppo/asynchronous/asynchronous.py)."""
    HELP_SECTIONS = {"rollout_ranks": "Asynchronous RL and the rollout ledger"}

    rollout_ranks: int = field(0, ge=0, help="Processes of the launch that only generate rollouts (the last ones); "
                                             "the others train. 0 = synchronous: every process generates, then "
                                             "trains.")
    max_staleness: int = field(0, ge=0, help="How many policy versions older than the one being updated a trained "
                                             "sample may be: step t trains on prompt batch t sampled by the policy "
                                             "after step max(0, t - max_staleness). 0 = every sample from the "
                                             "current policy (the synchronous run's numbers).")
    behaviour_weight_cap: float = field(2.0, gt=0, help="Truncation C of the importance weight min(pi_prox / "
                                                        "pi_behaviour, C) that corrects samples from an older "
                                                        "policy (decoupled PPO with truncated importance "
                                                        "sampling; alignment/ppo/rl_math/off_policy.py).")
    partial_rollout_tokens: int = field(0, ge=0, help="Partial rollouts: a generation moves to the next policy "
                                                      "version every this many new tokens (keeping its KV cache, "
                                                      "as PipelineRL's in-flight weight updates), up to version "
                                                      "t - 1 for the batch step t trains; each token is tagged "
                                                      "with its version. Needs max_staleness >= 2. 0 = off.")
    rollout_ledger: bool = field(False, help="Write every trained sample (ids, version, behaviour log-probs, reward "
                                             "parts, the step that trained it) to <output_dir>/ledger/; always on "
                                             "with rollout_ranks > 0. tools/replay_ledger.py reports on it.")

    @property
    def asynchronous(self) -> bool:
        return self.rollout_ranks > 0

    @staticmethod
    def batches_per_step(ppo) -> int:
        """Prompt batches the rollout ranks sample for one step: dynamic sampling's max_gen_batches, else 1."""
        return ppo.max_gen_batches if ppo.dynamic_sampling else 1

    @property
    def ledger(self) -> bool:
        return self.rollout_ledger or self.asynchronous

    def validate_with(self, *others) -> None:
        ppo = next(other for other in others if isinstance(other, PPOArguments))
        if self.max_staleness and not self.asynchronous:
            raise ValueError("key 'max_staleness' > 0 needs rollout_ranks > 0 (a synchronous run is on-policy)")
        if not self.asynchronous:
            return
        if ppo.curriculum:
            raise ValueError("key 'curriculum' needs rollout_ranks 0: rollout ranks draw prompt batches ahead, "
                             "before the groups that would set their prompts aside are rewarded")
        if ppo.dynamic_sampling and ppo.max_gen_batches < 1:
            raise ValueError("key 'max_gen_batches' must be >= 1 with dynamic_sampling and rollout_ranks > 0: the "
                             "rollout ranks sample that many prompt batches ahead for every step")
        if self.partial_rollout_tokens and self.max_staleness < 2:
            raise ValueError("key 'partial_rollout_tokens' needs max_staleness >= 2: with max_staleness "
                             f"{self.max_staleness} a batch is already sampled by the newest version a partial "
                             "rollout may move to (the one before the step that trains it)")
        if self.partial_rollout_tokens and any(getattr(other, "multi_turn", False) for other in others):
            raise ValueError("key 'partial_rollout_tokens' with an 'environment': multi-turn episodes are sampled "
                             "by one version each")
        if ppo.eval_mode == "single":
            raise ValueError("key 'eval_mode' 'single' with rollout_ranks > 0: the rollout ranks hold their own "
                             "whole copy; leave eval_mode null")
