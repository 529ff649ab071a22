"""Experiment trackers (`report_to`; docs/trackers.md): every row the run writes to metrics.jsonl goes, at the same
step, to each tracker asked for. `check_trackers(args)` runs when the arguments are parsed (an unknown name or a
missing package is a one-line exit 2 before any work); `TrackerFanOut` is what MetricsLogger writes through.
The family and how to add one: trackers/base.py; the built-ins: files.py (VisualDL, TensorBoard) and services.py
(wandb, MLflow, SwanLab, trackio)."""
from __future__ import annotations

import json
import math
import os
from typing import Dict, List, Optional

from alignment.config.registry import TRACKERS
from alignment.fileio import write_json_atomic
from alignment.training.trackers import files, services  # noqa: F401 (the built-in trackers register)
from alignment.training.trackers.base import TrackedRun, Tracker, check_trackers, chosen, logging_dir_of

__all__ = ["TrackerFanOut", "Tracker", "TrackedRun", "check_trackers", "chosen", "dashboards", "STATE_FILE"]

STATE_FILE = "trackers.json"  # {tracker name: what it needs to continue its run (ids)}


class TrackerFanOut:
    """The trackers `report_to` asks for, opened together when the run logs its first row (rank 0 only)."""

    def __init__(self, args, config: Optional[dict] = None):
        self.args, self.config = args, config or {}
        self.classes = [TRACKERS.lookup(name) for name in chosen(args.report_to)]
        self.trackers: List[Tracker] = []

    @property
    def names(self) -> List[str]:
        return [cls.NAME for cls in self.classes]

    def open(self, resume_step: Optional[int]) -> None:
        """Open (or, for a resumed run, continue) each tracker's run, and keep the ids they report."""
        path = os.path.join(self.args.output_dir, STATE_FILE)
        state = {}
        if resume_step is not None and os.path.exists(path):
            with open(path, encoding="utf-8", errors="replace") as f:
                try:
                    state = json.load(f)
                except ValueError:
                    state = None
            if not isinstance(state, dict) or not all(isinstance(entry, dict) for entry in state.values()):
                print(f"{path} is not the trackers' JSON object of run ids: the trackers start new runs")
                state = {}
        for cls in self.classes:
            entry = state.setdefault(cls.NAME, {})
            self.trackers.append(cls(TrackedRun(self.args, self.config, resume_step, entry)))
        kept = {name: entry for name, entry in state.items() if entry}
        if kept:  # only trackers with a run id of their own keep one (VisualDL and TensorBoard: none)
            write_json_atomic(path, kept)

    def log(self, step: int, row: Dict[str, object]) -> None:
        """The row's finite numbers (not its step, texts or lists), under metrics.jsonl's keys."""
        scalars = {key: float(value) for key, value in row.items() if key != "step" and
                   isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)}
        if scalars:
            for tracker in self.trackers:
                tracker.log(step, scalars)

    def log_histogram(self, tag: str, values, step: int) -> None:
        for tracker in self.trackers:
            tracker.log_histogram(tag, values, step)

    def close(self) -> None:
        for tracker in self.trackers:
            tracker.close()
        self.trackers = []


def dashboards(args) -> List[str]:
    """'dashboard: COMMAND' lines, one for each tracker asked for that has a command showing what it wrote."""
    logging_dir = logging_dir_of(args)
    commands = (TRACKERS.lookup(name).dashboard(args, logging_dir) for name in chosen(args.report_to))
    return [f"dashboard: {command}" for command in commands if command]
