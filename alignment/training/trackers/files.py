"""The trackers that write event files under logging_dir: VisualDL and TensorBoard."""
from __future__ import annotations

import json
import os
from typing import Dict, Optional, Tuple

from alignment.training.trackers.base import Tracker, TrackedRun, import_problem


def visualdl_order(keys) -> list:
    """The keys in the order to write them: VisualDL and TensorBoard list a group's charts in the order their tags
    first appear (and the groups alphabetically: eval, memory, time, train), so rewards and KL come first."""
    def first(key: str) -> bool:
        name = key.split("/", 1)[1] if key.startswith(tuple(g + "/" for g in VISUALDL_GROUPS)) else key
        return name.split("/")[0] in FIRST_CHARTS

    keys = list(keys)
    return [k for k in keys if first(k)] + [k for k in keys if not first(k)]


VISUALDL_GROUPS = ("eval", "time", "memory")  # a metric "group/name" of these keeps its group
FIRST_CHARTS = ("reward", "gold_reward", "kl")  # what a user looks at first: shown first in their group


def visualdl_tag(key: str) -> str:
    """VisualDL and TensorBoard group scalars by the text before the first '/': every training metric goes to one
    open 'train' group ('reward/mean' -> 'train/reward_mean'), evaluation, timing and memory keep theirs."""
    group, _, rest = key.partition("/")
    if rest and group in VISUALDL_GROUPS:
        return key
    return "train/" + key.replace("/", "_")


class VisualDL(Tracker):
    """logging_dir/visualdl (`visualdl --logdir`). A resumed run adds a record file beside the earlier ones."""
    NAME, EXTRA, MODULES = "visualdl", None, ("visualdl",)  # a core dependency: no extra

    @classmethod
    def dashboard(cls, args, logging_dir: str) -> str:
        return f"visualdl --logdir {os.path.join(logging_dir, 'visualdl')}"

    def __init__(self, run: TrackedRun):
        super().__init__(run)
        from visualdl import LogWriter

        self.writer = LogWriter(logdir=run.local_dir("visualdl"))

    def log(self, step: int, scalars: Dict[str, float]) -> None:
        for key in visualdl_order(scalars):
            self.writer.add_scalar(tag=visualdl_tag(key), value=scalars[key], step=step)

    def log_histogram(self, tag: str, values, step: int) -> None:
        self.writer.add_histogram(tag=tag, values=values, step=step, buckets=20)

    def close(self) -> None:
        self.writer.close()


class TensorBoard(Tracker):
    """logging_dir/tensorboard (`tensorboard --logdir`), written by tensorboardX, else by torch's writer. A resumed
    run writes to the same directory with purge_step = the checkpoint's step + 1, so TensorBoard drops what the
    stopped run had logged after the checkpoint: the curves continue without a repeated step."""
    NAME, EXTRA = "tensorboard", "tensorboard"
    WRITERS = ("tensorboardX", "torch.utils.tensorboard")  # the modules with a SummaryWriter, in order of preference

    @classmethod
    def dashboard(cls, args, logging_dir: str) -> str:
        return f"tensorboard --logdir {os.path.join(logging_dir, 'tensorboard')}"

    @classmethod
    def missing_module(cls, args) -> Optional[Tuple[str, str]]:
        problems = [import_problem(module) for module in cls.WRITERS]
        return None if None in problems else (cls.WRITERS[0], problems[0])

    def __init__(self, run: TrackedRun):
        super().__init__(run)
        import importlib

        module = next(m for m in self.WRITERS if import_problem(m) is None)
        purge = None if run.resume_step is None else run.resume_step + 1
        self.writer = importlib.import_module(module).SummaryWriter(run.local_dir("tensorboard"), purge_step=purge)
        if run.resume_step is None:
            self.writer.add_text("arguments", "```json\n" + json.dumps(run.config, indent=2, default=str) + "\n```", 0)

    def log(self, step: int, scalars: Dict[str, float]) -> None:
        for key in visualdl_order(scalars):
            self.writer.add_scalar(visualdl_tag(key), scalars[key], step)

    def log_histogram(self, tag: str, values, step: int) -> None:
        import numpy as np

        self.writer.add_histogram(tag, np.asarray(values, dtype="float64"), step, bins=20)

    def close(self) -> None:
        self.writer.close()
