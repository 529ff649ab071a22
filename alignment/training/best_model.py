"""Best-model selection (PaddleNLP's / HF's load_best_model_at_end, metric_for_best_model, greater_is_better).

Every evaluation during training compares its `eval/<metric>` with the best so far; a better one saves the models
to `<output_dir>/best/` (the same layout as the final save). At the end, when the best evaluation was not the final
one, the final model folders are replaced by the best ones, so `<output_dir>/model` (PPO: `policy`, `value`) is
the best model. The best step and value travel in step checkpoints, so a resumed run keeps them.
"""
from __future__ import annotations

import math
import os
import shutil
from typing import Callable, Dict, Optional

BEST_DIR = "best"


def metric_key(name: str) -> str:
    """'accuracy', 'eval_accuracy' (HF's spelling) or 'eval/accuracy' -> 'eval/accuracy'."""
    for prefix in ("eval/", "eval_"):
        if name.startswith(prefix):
            name = name[len(prefix):]
    return "eval/" + name


def greater_is_better(name: str, given: Optional[bool]) -> bool:
    """HF's default when unset: higher is better unless the metric is a loss."""
    return given if given is not None else not name.endswith("loss")


def is_better(value: float, best: Optional[float], greater: bool) -> bool:
    """A finite value beats no best yet, and a best it exceeds (greater) or undercuts (not greater); ties keep the
    earlier model."""
    if not math.isfinite(value):
        return False
    return best is None or (value > best if greater else value < best)


class BestModel:
    def __init__(self, output_dir: str, metric: str, greater: Optional[bool]):
        self.output_dir, self.key = output_dir, metric_key(metric)
        self.greater = greater_is_better(self.key, greater)
        self.step: Optional[int] = None
        self.value: Optional[float] = None

    def consider(self, metrics: Dict[str, float], step: int, save: Callable[[str], None]) -> bool:
        """After an evaluation at `step`: save the models with `save(folder)` when `metrics` are the best so far
        (every rank calls this: saving is collective). Returns whether they were."""
        if self.key not in metrics:
            raise ValueError(f"key 'metric_for_best_model': {self.key!r} is not among the evaluation metrics "
                             f"{sorted(k for k in metrics if k.startswith('eval/'))}")
        if not is_better(float(metrics[self.key]), self.value, self.greater):
            return False
        save(os.path.join(self.output_dir, BEST_DIR))
        self.step, self.value = step, float(metrics[self.key])
        return True

    def restore(self, final_step: int, is_main: bool) -> Optional[str]:
        """At the end (after the final save): make the best models the final ones when the best evaluation came
        before the last step. Rank 0 moves the folders; returns a line for the log (None if nothing was kept)."""
        if self.step is None:
            return None
        best = os.path.join(self.output_dir, BEST_DIR)
        if self.step != final_step and is_main:
            for name in sorted(os.listdir(best)):
                final, old = os.path.join(self.output_dir, name), os.path.join(self.output_dir, f".{name}.replaced")
                if os.path.exists(final):
                    os.replace(final, old)  # two renames: at every moment one complete model has the final name
                os.replace(os.path.join(best, name), final)
                shutil.rmtree(old, ignore_errors=True)
            shutil.rmtree(best, ignore_errors=True)
        elif is_main:
            shutil.rmtree(best, ignore_errors=True)  # the final model is the best one
        return f"best model: step {self.step} ({self.key} {self.value:.4g}); it is the final model"

    def state_dict(self) -> dict:
        return {"step": self.step, "value": self.value}

    def load_state_dict(self, state: dict) -> None:
        self.step, self.value = state.get("step"), state.get("value")
