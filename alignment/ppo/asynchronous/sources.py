"""Where a training step's rollout comes from, as a strategy (like critic.py's): `LocalRollouts` (this rank samples
its shard of the prompt batch) or `RemoteRollouts` (rollout ranks sampled the batch: asynchronous.py). The
trainer asks neither which it has nor whether weights travel, batches were sampled ahead, or checkpoints hold them.
Both mark the actor with the policy version at each step's start and check every batch's weights digest
(weight_check.py) before the trainer scores it. `StepDraws` is what a step's rollout strategy
(dynamic_sampling.py, curriculum.SetAsideFlat) draws and rewards with.
"""
from __future__ import annotations

from typing import Dict, List

from alignment.launcher import rank
from alignment.models.weights_digest import set_policy_version
from alignment.parallel.distributed import shard
from alignment.ppo.asynchronous.asynchronous import RolloutSource, sample_ids
from alignment.ppo.rollout.dynamic_sampling import generation_seed
from alignment.ppo.asynchronous.weight_check import WeightsCheck, stamp


class LocalRollouts:
    """This rank samples its shard of each prompt batch of the stream (prompts: the trainer's
    prompt_stream.PromptStream) with the policy (sampler: samplers.PolicySampler)."""

    def __init__(self, prompts, sampler, group_size: int):
        self.prompts, self.sampler, self.group_size = prompts, sampler, group_size
        self.check = WeightsCheck()

    def start(self, step: int) -> None:
        pass

    def before_step(self, step: int, actor) -> Dict[str, float]:
        set_policy_version(actor, step)
        return {}

    def rollout(self, step: int, attempt: int):
        """The stream's next prompt batch, this rank's positions of it sampled here, stamped with the digest of
        the model that samples (once per step: the sampler is the trained model itself, so its digest is the
        version's)."""
        digest = self.check.record(step, self.sampler.model(step))
        batch = self.prompts.next_batch()
        positions = shard(list(range(len(batch))))
        with self.sampler.generating(attempt):
            rollout = self.sampler.sample(self.prompts.items(batch[p] for p in positions), step, positions=positions,
                                          total=len(batch))
        rollout.sample_ids = sample_ids(self.prompts.drawn - 1, batch, positions, self.group_size)
        stamp(rollout, digest, f"local engine of rank {rank()}")  # unless GKD's mix stamped its off-policy rows
        self.check.check(rollout, step)
        return rollout

    def unused(self, step: int, gen_batches: int) -> List[str]:
        return []

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        pass

    def drain(self, step: int, actor) -> None:
        pass


class RemoteRollouts(LocalRollouts):
    """Rollout ranks sample the stream (asynchronous.RolloutSource): weights go out at each step's start, the step
    takes its batch from the mailbox (this rank's shard of it), and the batches sampled ahead belong to the
    checkpoint."""

    def __init__(self, source: RolloutSource, group_size: int, pad_id: int):
        self.source, self.group_size, self.pad_id = source, group_size, pad_id
        self.check = WeightsCheck(source.schedule.staleness)

    def start(self, step: int) -> None:
        self.source.start(step)

    def before_step(self, step: int, actor) -> Dict[str, float]:
        """The version the rollout ranks sample the coming batches with (its digest recorded first)."""
        set_policy_version(actor, step)
        self.check.record(step, actor)
        return {"time/weight_sync": self.source.send_weights(step, actor)}

    def rollout(self, step: int, attempt: int):
        whole = self.source.rollout(step, attempt, self.pad_id)
        self.check.check(whole, step)
        n = self.group_size
        return whole.take([p * n + s for p in shard(list(range(len(whole) // n))) for s in range(n)])

    def unused(self, step: int, gen_batches: int) -> List[str]:
        return self.source.unused(step, gen_batches)

    def state_dict(self) -> dict:
        return {"sampled_ahead": self.source.state_dict(), **self.check.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        self.source.load_state_dict(state["sampled_ahead"])
        self.check.load_state_dict(state)

    def drain(self, step: int, actor) -> None:
        self.source.drain(step, actor)


def rollout_source(source, prompts, sampler, group_size: int, pad_id: int) -> LocalRollouts:
    """RemoteRollouts over an asynchronous run's RolloutSource, else LocalRollouts (source None)."""
    return LocalRollouts(prompts, sampler, group_size) if source is None else RemoteRollouts(source, group_size,
                                                                                            pad_id)


class StepDraws:
    """What a step's rollout strategy draws and rewards with, built once by the trainer: the rollout source, the
    prompt stream and the policy sampler (for the draw's seed), the end rewards (scoring.EndRewards) and the fault
    policy (fault_policy.GroupFaults), which drops the failed groups of each rollout drawn."""

    def __init__(self, rollouts: LocalRollouts, prompts, sampler, end_rewards, faults, seed: int):
        self.rollouts, self.prompts, self.sampler = rollouts, prompts, sampler
        self.end_rewards, self.faults, self.seed = end_rewards, faults, seed

    def draw(self, step: int, attempt: int):
        """Responses to the next prompt batch of the stream. Sampling noise is seeded per (step, attempt) and drawn
        per row of the global batch: the same rollout whether one process or several (any data / tensor-parallel
        split) generate it, and after a resume (which skips every batch drawn)."""
        self.prompts.count_draw()
        self.sampler.seed_draw(generation_seed(self.seed, step, attempt))
        return self.faults.without_failed_groups(step, self.rollouts.rollout(step, attempt))

    def rewarded(self, rollout):
        """The rollout's (end rewards [N], parts), computed in the reward phase."""
        return self.end_rewards.in_reward_phase(rollout)

    def unused(self, step: int, gen_batches: int) -> List[str]:
        """The source's prompt batches for the step that it did not reach (RemoteRollouts sampled them ahead)."""
        return self.rollouts.unused(step, gen_batches)
