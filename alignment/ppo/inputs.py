"""What a PPOTrainer is given: its models (teacher.py's strategy among them) and its prompt data."""
from __future__ import annotations

import dataclasses
from typing import Callable, Optional

from alignment.ppo.teacher.teacher import NoTeacher


@dataclasses.dataclass
class PolicyModels:
    actor: object  # LlamaForCausalLM (or its pipeline stages): trained
    reference: object  # frozen; with LoRA the actor itself, its adapters switched off
    critic: Optional[object]  # ScoreModel (or stages) when the estimator needs_critic; else None
    reward: object  # alignment.rewards.scoring.RewardComputer: reward model score + reward functions
    teacher: object = dataclasses.field(default_factory=NoTeacher)  # teacher.py: a Teacher or NoTeacher
    draft: Optional[object] = None  # rollout/drafts.py: the draft model rollouts speculate with (None: none)


@dataclasses.dataclass
class PromptData:
    prompts: object  # PromptOnlyDataset
    eval_prompts: Optional[object]
    collate_prompts: Callable
    ptx: Optional[object] = None  # SupervisedDataset for the ptx loss
    collate_ptx: Optional[Callable] = None
    eval_tasks: Optional[Callable] = None  # evaluation/inline.py's HeldOutTasks (false when it holds no task)
