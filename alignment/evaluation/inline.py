"""Evaluation tasks inside a training run: `HeldOutTasks(args)` evaluates the model being trained with the same
`evaluate` as `alignment-eval` (the same seeds, batches and engine width, so the bits equal a standalone run on
the step's checkpoint) and returns eval/<task>/<metric> means for the log."""
from __future__ import annotations

import os
from typing import Dict, List, Optional

from alignment.evaluation.runner import EvalSettings, evaluate
from alignment.evaluation.tasks import EvalTask, make_task


class HeldOutTasks:
    def __init__(self, tasks: List[EvalTask], settings: Optional[EvalSettings] = None):
        self.tasks, self.settings = tasks, settings or EvalSettings()

    @classmethod
    def from_args(cls, eval_args, seed: int, base_dir: Optional[str] = None) -> "HeldOutTasks":
        """The tasks eval_tasks names (user_eval_modules imported first); an unknown name is a ValueError."""
        from alignment.data.user_modules import import_user_module

        for module in eval_args.user_eval_modules:
            import_user_module(module, base_dir)
        try:
            tasks = [make_task(name) for name in eval_args.eval_tasks]
        except ValueError as err:
            raise ValueError(f"key 'eval_tasks': {err}") from None
        return cls(tasks, EvalSettings(n=eval_args.eval_k, temperature=eval_args.eval_temperature,
                                       seed=seed, batch_size=eval_args.eval_batch_size, limit=eval_args.eval_limit))

    def __bool__(self) -> bool:
        return bool(self.tasks)

    def __call__(self, model, tokenizer, step: int, output_dir: Optional[str]) -> Dict[str, float]:
        from alignment.evaluation.policies import LocalPolicy
        from alignment.evaluation.report import write_summary

        policy, out = LocalPolicy(model=model, tokenizer=tokenizer), {}
        for task in self.tasks:
            where = os.path.join(output_dir, "eval_tasks", f"step-{step}", task.NAME) if output_dir else None
            result = evaluate(policy, task, self.settings, where)
            if where:
                write_summary(where, result)
            out.update({f"eval/{task.NAME}/{name}": v["mean"] for name, v in result["summary"].items()})
        return out
