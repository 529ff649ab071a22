"""What a PPO-family run keeps in a checkpoint beyond the skeleton's (training/trainer.py): the data streams drawn,
the curriculum's prompt pool, the reward statistics and the asynchronous sources' state; and how it saves, with
offloaded models brought back first. A mixin of PPOTrainer (ppo/ppo_trainer.py), which holds what these read."""
from __future__ import annotations

import os

from alignment.parallel.distributed import barrier


class PPOCheckpoints:
    def trainer_state(self) -> dict:
        return {**super().trainer_state(), "drawn": {"prompts": self.prompt_stream.drawn, "ptx": self.ptx.drawn},
                "prompt_pool": self.prompt_stream.pool_state_dict(),
                "reward_stats": self.reward_stats.state_dict(),
                **self.rollouts.state_dict()}

    def load_trainer_state(self, state: dict) -> None:
        super().load_trainer_state(state)
        self.prompt_stream.resume(state["drawn"]["prompts"], state.get("prompt_pool"))
        self.ptx_skip = state["drawn"]["ptx"]
        self.reward_stats.load_state_dict(state["reward_stats"])
        self.rollouts.load_state_dict(state)
        if self.ledger is not None:
            self.ledger.resume_at(self.global_step)

    def save_step_checkpoint(self) -> None:
        self.rollouts.drain(self.global_step, self.actor)  # the batches sampled ahead belong to the checkpoint
        with self.offload.phase("checkpoint", [self.actor, self.critic.model], self.offload.optimizers):
            super().save_step_checkpoint()

    def save(self, output_dir: str) -> None:
        with self.offload.phase("save", [self.actor, self.critic.model]):
            for name, t in self.trained.items():  # every rank calls save_pretrained; rank 0 writes
                t.model.save_pretrained(os.path.join(output_dir, name), tokenizer_dir=self.tokenizer.name_or_path)
            barrier()
