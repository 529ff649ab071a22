"""The training prompts as a PPO-family step draws them: a collaborator the trainer builds once and hands to the
rollout strategies (sources.py, curriculum.SetAsideFlat). It holds the prompt items, the batches of their indices
(curriculum.py: a PromptPool with `curriculum`, else the plain epoch stream) and the count of batches drawn, which
a checkpoint keeps so that a resumed run draws the batches the uninterrupted one would have."""
from __future__ import annotations

from typing import Dict, Iterable, List, Optional, Sequence

import numpy as np

from alignment.ppo.rollout.curriculum import prompt_batches


class PromptStream:
    def __init__(self, prompts, ppo, args, world: int):
        self.prompts, self.ppo, self.args, self.world = prompts, ppo, args, world  # prompts: a PromptOnlyDataset
        self.drawn = 0  # batches drawn, here or by rollout ranks (resume skips them)
        self.pool_state: Optional[dict] = None  # a resumed curriculum's prompt pool
        self.batches = None

    def start(self) -> None:
        """(Re)open the batches, past those drawn."""
        self.batches = prompt_batches(self.ppo, len(self.prompts), self.world, self.args, self.drawn, self.pool_state)

    def count_draw(self) -> None:
        self.drawn += 1

    def next_batch(self) -> np.ndarray:
        """The next batch [per_device_prompt_batch_size x data ranks] of prompt indices."""
        return next(self.batches)

    def items(self, indices: Iterable) -> List[dict]:
        return [self.prompts[int(i)] for i in indices]

    def observe(self, prompts: Sequence[int], rewards: Sequence[float], group_size: int) -> Dict[str, float]:
        """The curriculum's record of each prompt's group (PromptPool.observe) -> the curriculum/* metrics."""
        return self.batches.observe(prompts, rewards, group_size)

    def pool_state_dict(self) -> dict:
        return self.batches.state_dict()

    def resume(self, drawn: int, pool_state: Optional[dict]) -> None:
        self.drawn, self.pool_state = drawn, pool_state
