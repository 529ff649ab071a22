"""The family of experiment trackers (`report_to`) and what each is told about the run. A tracker is a class with a
NAME in the TRACKERS registry (alignment/config/registry.py); it is built on rank 0 when the run logs its first row
and then gets every row of metrics.jsonl, at the same step::

    class MyTracker(Tracker):
        NAME, EXTRA, MODULES = "mine", "mine", ("my_package",)
        def __init__(self, run: TrackedRun): ...        # open or continue the tracker's run
        def log(self, step: int, scalars: dict): ...    # the row's finite numbers, under metrics.jsonl's keys
        def close(self): ...

`run.state` is this tracker's entry of output_dir/trackers.json (e.g. a run id), kept for a resumed run."""
from __future__ import annotations

import dataclasses
import importlib
import os
from typing import ClassVar, Dict, List, Optional, Tuple

from alignment.config.registry import TRACKERS, Registered

DEFAULT_PROJECT = "alignment"


@dataclasses.dataclass
class TrackedRun:
    """What every tracker is told about the run."""
    args: object                # the training arguments (tracker keys: run_name, logging_dir, project, wandb_mode)
    config: dict                # the effective arguments (args.json), logged as the run's configuration
    resume_step: Optional[int]  # the checkpoint's step of a resumed run (its rows up to there are kept); None: fresh
    state: dict                 # this tracker's entry of output_dir/trackers.json

    @property
    def name(self) -> str:
        return self.args.run_name or os.path.basename(os.path.abspath(self.args.output_dir))

    @property
    def logging_dir(self) -> str:
        return logging_dir_of(self.args)

    def project(self, environment_variable: Optional[str] = None) -> str:
        """The project key, else the tracker's own environment variable, else 'alignment'."""
        return self.args.project or os.environ.get(environment_variable or "", "") or DEFAULT_PROJECT

    def local_dir(self, name: str) -> str:
        path = os.path.join(self.logging_dir, name)
        os.makedirs(path, exist_ok=True)
        return path


class Tracker(Registered, registry=TRACKERS):
    """A place metrics go besides metrics.jsonl: `log(step, scalars)` gets every row's finite numbers at the row's
    step, `close()` ends its run; MODULES are what must import and EXTRA the pip extra that installs them (a missing
    one stops the run before any work). How each built-in resumes: docs/trackers.md."""

    EXTRA: ClassVar[Optional[str]] = None    # the optional extra of pyproject.toml that installs its package
    MODULES: ClassVar[Tuple[str, ...]] = ()  # the modules it imports

    def __init__(self, run: TrackedRun):
        self.run = run

    @classmethod
    def modules(cls, args) -> Tuple[str, ...]:
        """The modules it needs under `args` (None: the defaults)."""
        return cls.MODULES

    @classmethod
    def missing_module(cls, args) -> Optional[Tuple[str, str]]:
        """(module, why) of the first module it needs that does not import under `args`; None: all import."""
        for module in cls.modules(args):
            why = import_problem(module)
            if why:
                return module, why
        return None

    @classmethod
    def dashboard(cls, args, logging_dir: str) -> Optional[str]:
        """The command that shows what it wrote (printed at the end of the run), or None."""
        return None

    def log(self, step: int, scalars: Dict[str, float]) -> None:
        raise NotImplementedError

    def log_histogram(self, tag: str, values, step: int) -> None:
        """A histogram (e.g. a reward model's scores); trackers without a histogram view skip it."""

    def close(self) -> None:
        """Flush and end the tracker's run."""


def logging_dir_of(args) -> str:
    """Where the trackers' local files go: logging_dir, a relative one under output_dir (so that a run's files stay
    together, and PaddleNLP's sample `logging_dir: vdl_log` does not gather every run in one folder); null:
    output_dir."""
    return os.path.join(args.output_dir, args.logging_dir) if args.logging_dir else args.output_dir


def import_problem(module: str) -> Optional[str]:
    """Why `module` does not import (its ImportError's text), or None when it does."""
    try:
        importlib.import_module(module)
    except ImportError as err:
        return str(err) or type(err).__name__
    return None


def chosen(names: List[str]) -> List[str]:
    """The tracker names `report_to` asks for: 'none' / [] -> none, 'all' -> every registered tracker whose
    package imports (HF's and PaddleNLP's meaning), else the names as given (duplicates once)."""
    if names in ([], ["none"]):
        return []
    if names == ["all"]:
        return [name for name, cls in TRACKERS.classes.items() if cls.missing_module(None) is None]
    return list(dict.fromkeys(names))


def check_trackers(args) -> None:
    """ValueError (one line) for a name no tracker is registered under, or a tracker whose package does not
    import, naming the extra that installs it: before any work is done."""
    names = chosen(args.report_to)
    for name in names:  # every name first: an unknown one is named even beside a tracker that is not installed
        TRACKERS.check("report_to", name)
    for name in names:
        cls = TRACKERS[name]
        missing = cls.missing_module(args)
        if missing:
            how = (f"install the extra: pip install 'paddle-alignment[{cls.EXTRA}]' (in a checkout: pip install -e "
                   f"'.[{cls.EXTRA}]')") if cls.EXTRA else f"install it: pip install {missing[0]}"
            raise ValueError(f"key 'report_to': tracker {name!r} needs the {missing[0]!r} module, which does not "
                             f"import ({missing[1]}); {how}")
