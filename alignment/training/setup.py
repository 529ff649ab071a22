"""Start-of-run helpers shared by the entry points: argument echo, data loading, clean failures."""
from __future__ import annotations

import contextlib
import json
import sys

from alignment.config.parser import ArgumentError, ArgumentParser, to_dict
from alignment.data import MixedRawDataset, import_user_modules


@contextlib.contextmanager
def user_errors():
    """Turn the errors of loading user inputs (missing paths, bad files, bad values) into a one-line exit."""
    try:
        yield
    except (FileNotFoundError, ValueError) as err:  # DataFormatError and ArgumentError are ValueErrors
        fail(err)


@contextlib.contextmanager
def training_stops():
    """A run that stops itself on purpose (TrainingStopped: e.g. NaN/inf steps) exits 1 with its message."""
    from alignment.training.guard import TrainingStopped

    try:
        yield
    except TrainingStopped as err:
        fail(err, code=1)


def fail(error: Exception, code: int = 2) -> None:
    """Exit non-zero with a one-line message (no traceback) for errors the user can fix."""
    print(f"error: {error}", file=sys.stderr)
    raise SystemExit(code)


def parse_arguments(argv, *dataclass_types):
    """Parse an argument file + flags into the dataclasses and print the effective configuration.

    Returns (instances..., effective dict); exits with a one-line message on bad arguments.
    """
    try:
        instances = ArgumentParser(*dataclass_types).parse_args(sys.argv[1:] if argv is None else argv)
    except ArgumentError as err:
        fail(err)
    effective = to_dict(*instances)
    print("effective arguments:\n" + json.dumps(effective, indent=2, sort_keys=True, default=str))
    return (*instances, effective)


def start_processes(train_args, pipeline: bool = False):
    """Start the process groups the launch and the parallel degrees ask for (fleet's hybrid groups for tensor /
    pipeline parallelism or sharding), before any model is built: models built afterwards are split accordingly.
    pipeline: whether this stage has pipeline-parallel models (PPO's policy and critic)."""
    from alignment.config.layout import plan
    from alignment.parallel.distributed import init_distributed, rank
    from alignment.parallel.watchdog import start_watchdog

    try:
        layout = plan(train_args)
        if layout.pipeline > 1 and not pipeline:
            raise ValueError("key 'pipeline_parallel_degree' > 1: pipeline-parallel models exist for PPO's policy "
                             "and critic only; use tensor_parallel_degree / sharding for this stage")
    except ValueError as err:
        fail(err)
    init_distributed(layout)
    if layout.world > 1:
        start_watchdog(rank(), layout.world, train_args.lost_rank_timeout)
        print(f"processes: {layout.describe()}")
    return layout


def load_raw(data_args, seed: int):
    """(train, eval or None) raw datasets from the argument specs; user modules are imported first.

    Bad specs or files raise DataFormatError / FileNotFoundError / ValueError: call it inside `user_errors()`.
    """
    import_user_modules(data_args.user_dataset_modules)
    train = MixedRawDataset(data_args.train_datasets, seed=seed)
    evaluation = MixedRawDataset(data_args.eval_datasets, seed=seed) if data_args.eval_datasets else None
    for name, dataset in (("train", train), ("eval", evaluation)):
        if dataset is not None:
            print(f"{name} data: " + ", ".join(f"{s.name} {s.selected}/{s.available}" for s in dataset.sources))
    return train, evaluation
