"""Held-out tasks evaluated during training (the evaluation harness, alignment/evaluation): the same code as
`alignment-eval`, run every eval_steps and at the end, logged as eval/<task>/<metric>."""
from __future__ import annotations

import dataclasses
from typing import List, Optional

from alignment.config.parser import field


@dataclasses.dataclass
class EvaluationArguments:
    """Held-out evaluation tasks (docs/evaluation.md)."""
    HELP_SECTIONS = {"eval_tasks": "Held-out evaluation tasks"}

    eval_tasks: List[str] = field([], help="Registered evaluation tasks (alignment-eval --list-tasks, or a user "
                                           "one's NAME from user_eval_modules) evaluated every eval_steps and at "
                                           "the end; results under output_dir/eval_tasks/step-N/<task>/.")
    eval_k: int = field(1, ge=1, help="Samples per item of eval_tasks: pass@k, maj@k, mean@k for k up to it.")
    eval_temperature: Optional[float] = field(None, ge=0, help="Sampling temperature of eval_tasks; null = greedy "
                                                               "for eval_k 1, else 1.0.")
    eval_limit: int = field(0, ge=0, help="Evaluate the first N items of each task (0 = all).")
    eval_batch_size: int = field(32, ge=1, help="Sequences of eval_tasks decoded together.")
    user_eval_modules: List[str] = field([], help="Python files or dotted modules imported before the run, so the "
                                                  "evaluation tasks they define register.")
