"""A difficulty-aware prompt stream (key `curriculum`): a prompt whose last `curriculum_patience` groups all had
equal rewards (all correct or all wrong: zero group advantage, nothing to learn) is set aside, and the stream's
next prompts take its places in the coming batches, as prime-rl's difficulty filter and DAPO's dynamic sampling
(Yu et al. 2025, arXiv 2503.14476) spend their samples on prompts with signal; DAPO filters after sampling,
this before.

The stream is epoch_batches' seeded permutations laid end to end; a batch takes the next prompts that are not set
aside, so batches are always whole and may cross an epoch. When fewer prompts than one batch are left, every
prompt set aside comes back (`curriculum/readmissions`). The pool's state (position in the stream, streaks, the
prompts set aside) is part of the checkpoint: a resumed run draws the same batches. One data-parallel process
(tensor parallelism shares its rows), as dynamic sampling: the groups' rewards are read in batch order.
"""
from __future__ import annotations

from typing import Dict, List, Optional, Sequence

import numpy as np

from alignment.training.batches import epoch_batches, skip_batches


class PromptPool:
    def __init__(self, num_items: int, batch_size: int, seed: int, patience: int = 1, state: Optional[dict] = None):
        if num_items < batch_size:
            raise ValueError(f"key 'curriculum': {num_items} prompts do not fill one batch of {batch_size}")
        self.num_items, self.batch_size, self.seed, self.patience = num_items, batch_size, seed, patience
        state = state or {}
        self.position = int(state.get("position", 0))  # prompts taken from the stream (set-aside ones skipped too)
        self.streaks: Dict[int, int] = {int(k): v for k, v in state.get("streaks", {}).items()}
        self.set_aside: Dict[int, float] = {int(k): v for k, v in state.get("set_aside", {}).items()}
        self.readmissions = int(state.get("readmissions", 0))
        self._epoch, self._order = -1, None

    def order(self, epoch: int) -> np.ndarray:
        if epoch != self._epoch:  # the permutation epoch_batches draws for this epoch
            self._epoch, self._order = epoch, np.random.default_rng(self.seed + epoch).permutation(self.num_items)
        return self._order

    def __iter__(self):
        return self

    def __next__(self) -> np.ndarray:
        """The next batch [batch_size] of dataset indices, none set aside, none twice."""
        if self.num_items - len(self.set_aside) < self.batch_size:
            self.set_aside.clear()
            self.readmissions += 1
        batch: List[int] = []
        while len(batch) < self.batch_size:
            epoch, offset = divmod(self.position, self.num_items)
            index = int(self.order(epoch)[offset])
            self.position += 1
            if index not in self.set_aside and index not in batch:
                batch.append(index)
        return np.asarray(batch)

    def observe(self, prompts: Sequence[int], rewards: Sequence[float], group_size: int) -> Dict[str, float]:
        """Record each prompt's group (rows of one prompt contiguous: rewards [P * G], prompts [P]); a prompt
        whose streak of equal-reward groups reaches `patience` is set aside. -> the curriculum/* metrics."""
        groups = np.asarray(rewards, dtype="float64").reshape([-1, group_size])  # [P, G]
        flat = groups.max(axis=1) == groups.min(axis=1)  # [P]: no reward spread
        for prompt, same in zip(prompts, flat.tolist()):
            self.streaks[int(prompt)] = self.streaks.get(int(prompt), 0) + 1 if same else 0
            if self.streaks[int(prompt)] >= self.patience:
                self.set_aside[int(prompt)] = float(groups[list(prompts).index(prompt), 0])
        return {"curriculum/zero_variance_groups": float(flat.mean()), "curriculum/set_aside": float(len(
            self.set_aside)), "curriculum/pool": float(self.num_items - len(self.set_aside)),
            "curriculum/readmissions": float(self.readmissions)}

    def state_dict(self) -> dict:
        return {"position": self.position, "streaks": {str(k): v for k, v in self.streaks.items()},
                "set_aside": {str(k): v for k, v in self.set_aside.items()}, "readmissions": self.readmissions}


class EpochStream:
    """The plain prompt stream: epoch_batches, past the batches a resumed run drew; no state of its own."""

    def __init__(self, num_items: int, batch_size: int, seed: int, min_size: int, drop_last: bool, drawn: int):
        self.batches = skip_batches(epoch_batches(num_items, batch_size, seed, min_size=min_size,
                                                  drop_last=drop_last), drawn)

    def __iter__(self):
        return self

    def __next__(self) -> np.ndarray:
        return next(self.batches)

    def state_dict(self) -> dict:
        return {}


def prompt_batches(ppo, num_items: int, world: int, args, drawn: int, state: Optional[dict]):
    """The batches of a PromptStream (prompt_stream.py): a PromptPool with `curriculum` (its state from the
    checkpoint), else the plain stream."""
    batch_size = ppo.per_device_prompt_batch_size * world
    if ppo.curriculum:
        return PromptPool(num_items, batch_size, args.seed, ppo.curriculum_patience, state)
    return EpochStream(num_items, batch_size, args.seed, world, args.dataloader_drop_last, drawn)


class SetAsideFlat:
    """The step's rollout for a PromptPool run: the next batch drawn and rewarded (so its groups are recorded in
    the pool before the step goes on); the rewards go on to scoring as dynamic sampling's do."""

    def __init__(self, prompts, group_size: int):
        self.prompts, self.group_size = prompts, group_size  # prompts: the trainer's PromptStream

    def __call__(self, step: int, draws):
        """draws: the trainer's sources.StepDraws."""
        from alignment.parallel.distributed import gather_lists

        rollout = draws.draw(step, attempt=0)
        rewards, parts = draws.rewarded(rollout)
        every = gather_lists(rewards.numpy().tolist())  # [P * G], one data rank: every row in batch order
        group = self.group_size
        prompts = [int(row.split(":")[2]) for row in gather_lists(list(rollout.sample_ids))[::group]]  # [P]
        return rollout, (rewards, parts), self.prompts.observe(prompts, every, group)
