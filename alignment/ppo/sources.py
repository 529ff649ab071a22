"""Where a training step's rollout comes from, as a strategy (like critic.py's): `LocalRollouts` (this rank samples
its shard of the prompt batch) or `RemoteRollouts` (rollout ranks sampled the batch: asynchronous.py). The
trainer asks neither which it has nor whether weights travel, batches were sampled ahead, or checkpoints hold them.
Both mark the actor with the policy version at each step's start and check every batch's weights digest
(weight_check.py) before the trainer scores it.
"""
from __future__ import annotations

from typing import Dict, List

from alignment.launcher import rank
from alignment.models.weights_digest import set_policy_version
from alignment.parallel.distributed import shard
from alignment.ppo.asynchronous import RolloutSource, sample_ids
from alignment.ppo.weight_check import WeightsCheck, stamp


class LocalRollouts:
    """This rank samples its shard of each prompt batch of the stream (trainer.make_rollout)."""
    samples_here = True  # the policy that samples is the one the update starts from

    def __init__(self):
        self.check = WeightsCheck()

    def start(self, step: int) -> None:
        pass

    def before_step(self, step: int, actor) -> Dict[str, float]:
        set_policy_version(actor, step)
        return {}

    def rollout(self, trainer, attempt: int):
        """The trainer's next prompt batch, this rank's positions of it sampled here, stamped with the digest of
        the model that samples (once per step: the sampler is the trained model itself, so its digest is the
        version's)."""
        digest = self.check.record(trainer.global_step, trainer.rollout_actor())
        batch = next(trainer.prompt_batches)
        positions = shard(list(range(len(batch))))
        trainer.show_phase(phase="generate", **({"try": str(attempt + 1)} if attempt else {}),
                           **trainer.generation_speed)
        with trainer.offload.phase("generate", [trainer.actor, *trainer.teacher.generating]), \
                trainer.precision.autocast():
            rollout = trainer.make_rollout([trainer.data.prompts[int(batch[p])] for p in positions],
                                           positions=positions, total=len(batch))
        rollout.sample_ids = sample_ids(trainer.drawn["prompts"] - 1, batch, positions,
                                        trainer.ppo.num_return_sequences)
        stamp(rollout, digest, f"local engine of rank {rank()}")  # unless GKD's mix stamped its off-policy rows
        self.check.check(rollout, trainer.global_step)
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
    samples_here = False

    def __init__(self, source: RolloutSource):
        self.source = source
        self.check = WeightsCheck(source.schedule.staleness)

    def start(self, step: int) -> None:
        self.source.start(step)

    def before_step(self, step: int, actor) -> Dict[str, float]:
        """The version the rollout ranks sample the coming batches with (its digest recorded first)."""
        set_policy_version(actor, step)
        self.check.record(step, actor)
        return {"time/weight_sync": self.source.send_weights(step, actor)}

    def rollout(self, trainer, attempt: int):
        whole = self.source.rollout(trainer.global_step, attempt, trainer.tokenizer.pad_token_id)
        self.check.check(whole, trainer.global_step)
        n = trainer.ppo.num_return_sequences
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


def rollout_source(source=None) -> LocalRollouts:
    """RemoteRollouts over an asynchronous run's RolloutSource, else LocalRollouts."""
    return LocalRollouts() if source is None else RemoteRollouts(source)
