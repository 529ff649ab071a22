"""Step-labelled solutions for process reward models (PRM): `process-reward` rows, in either of two shapes.

- Math-Shepherd (and PaddleNLP's PRM data): ``input`` is the question and its solution with ``ки`` after every
  step, ``label`` the same text with ``+`` (a correct step) or ``-`` in each ``ки``'s place.
- Explicit: ``prompt`` (or ``input``), ``steps`` (a list of strings) and ``labels`` (or ``step_labels``): one
  boolean (or 1/0, "+"/"-") per step.

Either becomes a RawSample with ``input`` (the text before the first step; "" for Math-Shepherd, whose first step
holds the question), ``steps`` and ``step_labels``.
"""
from __future__ import annotations

from typing import Any

from alignment.data.builtin import JsonRowsDataset, RowError
from alignment.data.raw import RawSample

MATH_SHEPHERD_PLACEHOLDER = "ки"
GOOD, BAD = ("+", 1, True, "1", "true"), ("-", 0, False, "0", "false")


def step_label(value: Any, where: str) -> bool:
    for options, verdict in ((GOOD, True), (BAD, False)):
        if any(value == option and type(value) is type(option) for option in options):
            return verdict
    raise RowError(f"{where}: a step label must be +/- , 1/0 or true/false, got {value!r}")


def math_shepherd_steps(text: str, label: str) -> tuple:
    """(steps, labels) of a Math-Shepherd row: the text cut at each placeholder, the label's character there."""
    pieces = text.split(MATH_SHEPHERD_PLACEHOLDER)
    steps, labels, offset = pieces[:-1], [], 0
    if not steps:
        raise RowError(f"'input' has no {MATH_SHEPHERD_PLACEHOLDER!r} after a step")
    for piece in steps:
        offset += len(piece)
        if offset >= len(label):
            raise RowError("'label' is shorter than 'input': it must be 'input' with +/- in each placeholder's place")
        labels.append(step_label(label[offset], "'label'"))
        offset += 1
    return steps, labels


class ProcessRewardRows(JsonRowsDataset):
    NAME = "process-reward"
    ALIASES = ("math-shepherd", "prm")
    REQUIREMENT = ("rows need input with 'ки' after each step and label (Math-Shepherd), or prompt, steps and "
                   "labels")
    DETECT_KEYS = (frozenset({"steps", "labels"}), frozenset({"steps", "step_labels"}))

    def convert_row(self, row: dict[str, Any]) -> RawSample:
        if isinstance(row.get("label"), str) and isinstance(row.get("input"), str):
            steps, labels = math_shepherd_steps(row["input"], row["label"])
            return RawSample(input="", steps=steps, step_labels=labels)
        prompt = row.get("prompt", row.get("input", ""))
        steps, labels = row.get("steps"), row.get("labels", row.get("step_labels"))
        if not isinstance(prompt, str):
            raise RowError(f"'prompt' must be a string, got {type(prompt).__name__}", "prompt")
        if not isinstance(steps, list) or not steps or not all(isinstance(step, str) for step in steps):
            raise RowError("'steps' must be a non-empty list of strings", "steps")
        if not isinstance(labels, list) or len(labels) != len(steps):
            raise RowError(f"'labels' must be a list of one label per step ({len(steps)})", "labels")
        return RawSample(input=prompt, steps=steps, step_labels=[step_label(v, "'labels'") for v in labels])
