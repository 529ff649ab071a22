"""The NaN/inf guard: a step whose loss or gradients are not finite is skipped, and a run that keeps producing them
stops with a message instead of training on garbage. An update that leaves a weight non-finite (an infinite
learning rate, an overflowing optimizer state) stops the run before anything is saved."""
from __future__ import annotations

import math

import paddle
from paddle import _C_ops

from alignment.parallel.distributed import on_any_rank


def all_finite(params) -> bool:
    """Whether every element of `params` is finite. One squared_l2_norm kernel per tensor and one sum: a NaN or
    inf anywhere makes the sum NaN or inf (a third of the time of isfinite + all per tensor on CPU: 1.6 vs 5.1 ms
    for an 8.3M-parameter model; measured). Only when the sum is not finite, which squares above ~1e19 can also
    cause, does the exact check per tensor decide."""
    if not params:
        return True
    squares = [_C_ops.squared_l2_norm(p if p.dtype == paddle.float32 else p.astype("float32")) for p in params]
    total = paddle.add_n([square.reshape([]) for square in squares])
    if math.isfinite(float(total)):
        return True
    return bool(paddle.stack([paddle.isfinite(p).all() for p in params]).all())


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

    def check_weights(self, step: int, weights) -> None:
        """Raise TrainingStopped when any of the trained `weights` (what this rank holds of them) is NaN/inf on any
        rank (a collective)."""
        if on_any_rank(not all_finite(list(weights))):
            raise TrainingStopped(
                f"step {step}: the update made weights NaN/inf (is learning_rate finite and sensible?); stopping "
                f"without saving them. Checkpoints already written under {self.output_dir} are intact.")

    def state_dict(self) -> dict:
        return {"skipped": self.skipped, "in_a_row": self.in_a_row}

    def load_state_dict(self, state: dict) -> None:
        self.skipped, self.in_a_row = state["skipped"], state["in_a_row"]
