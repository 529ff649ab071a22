"""The NaN/inf guard: a step whose loss or gradients are not finite is skipped, and a run that keeps producing them
stops with a message instead of training on garbage."""
from __future__ import annotations

import math


class TrainingStopped(RuntimeError):
    """The run cannot go on (e.g. too many non-finite steps in a row); the message says why and what is intact."""


class NonFiniteGuard:
    """Counts steps whose loss or gradients are NaN/inf (the caller skips them) and stops the run after
    `limit` in a row."""

    def __init__(self, limit: int, output_dir: str):
        self.limit, self.output_dir = limit, output_dir
        self.skipped = self.in_a_row = 0

    def check(self, step: int, *values: float) -> bool:
        """True when every value is finite; otherwise count the step and raise after `limit` in a row."""
        if all(math.isfinite(v) for v in values):
            self.in_a_row = 0
            return True
        self.skipped += 1
        self.in_a_row += 1
        if self.in_a_row >= self.limit:
            raise TrainingStopped(
                f"step {step}: loss or gradients were NaN/inf in {self.in_a_row} steps in a row (key "
                f"'max_nonfinite_steps' = {self.limit}); stopping without saving. Checkpoints already written "
                f"under {self.output_dir} are intact: lower learning_rate and resume with resume_from_checkpoint.")
        return False

    def state_dict(self) -> dict:
        return {"skipped": self.skipped, "in_a_row": self.in_a_row}

    def load_state_dict(self, state: dict) -> None:
        self.skipped, self.in_a_row = state["skipped"], state["in_a_row"]
