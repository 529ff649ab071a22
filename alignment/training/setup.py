"""Start-of-run helpers shared by the entry points: argument echo, data loading, clean failures."""
from __future__ import annotations

import contextlib
import json
import os
import sys
import time

from alignment.config.parser import ArgumentError, ArgumentParser, to_dict
from alignment.data import MixedRawDataset, import_user_modules

_STARTED = time.monotonic()  # imported first thing by every entry point: the stage's wall time starts here
_argument_dir = None  # the directory of the argument file: relative user_dataset_modules paths start there


@contextlib.contextmanager
def user_errors():
    """Turn the errors of loading user inputs (missing paths, bad files, bad values) into a one-line exit."""
    try:
        yield
    except (OSError, ValueError) as err:  # DataFormatError and ArgumentError are ValueErrors
        fail(_described(err))


@contextlib.contextmanager
def training_stops():
    """A run that stops itself on purpose (TrainingStopped: e.g. NaN/inf steps) or cannot write (OSError: e.g. a
    full disk) exits 1 with a one-line message."""
    from safetensors import SafetensorError

    from alignment.training.guard import TrainingStopped

    try:
        yield
    except TrainingStopped as err:
        fail(err, code=1)
    except (OSError, SafetensorError) as err:  # a full disk, an unwritable directory: what was saved is intact
        fail(f"{_described(err)}; checkpoints completed before this are intact (resume_from_checkpoint: auto)",
             code=1)


def _described(err: Exception) -> str:
    """An OSError as 'path: reason' (the str() of some omits the path); other errors as they are."""
    if isinstance(err, OSError) and err.strerror and not isinstance(err, FileNotFoundError):
        return f"{err.filename}: {err.strerror}" if err.filename else err.strerror
    return str(err)


def fail(error, code: int = 2) -> None:
    """Exit non-zero with a one-line message (no traceback) for errors the user can fix."""
    from alignment.training.output_dir import release_unused_output_dirs

    print(f"error: {error}", file=sys.stderr)
    release_unused_output_dirs()
    raise SystemExit(code)


def program_name(argv0: str = None) -> str:
    """How this run was started, for usage lines: 'python alignment/ppo/run_ppo.py', 'python -m alignment.ppo' or
    a console command ('alignment-ppo')."""
    argv0 = sys.argv[0] if argv0 is None else argv0
    if os.path.basename(argv0) == "__main__.py":
        return f"python -m alignment.{os.path.basename(os.path.dirname(os.path.abspath(argv0)))}"
    if argv0.endswith(".py"):
        return f"python {os.path.relpath(argv0)}"
    return os.path.basename(argv0)


def beside(path, base_dir: str):
    """A relative path that names nothing from the working directory but something beside the argument file
    becomes that; every other path stays as written (PaddleNLP's files are written for the working directory)."""
    if not isinstance(path, str) or not path or os.path.isabs(path) or os.path.exists(path):
        return path
    candidate = os.path.join(base_dir, path)
    return candidate if os.path.exists(candidate) else path


def paths_beside_the_file(instance, base_dir: str) -> None:
    """Resolve the model paths (`*_name_or_path`, `*_path`) and dataset paths (`*_datasets`) of one parsed
    argument class with `beside`."""
    from alignment.data.raw import parse_dataset_specs

    for name, value in vars(instance).items():
        if value and (name.endswith("_name_or_path") or name.endswith("_path")):
            setattr(instance, name, beside(value, base_dir))
        elif value and name.endswith("_datasets"):
            specs = parse_dataset_specs(value)
            if any(beside(spec.path, base_dir) != spec.path for spec in specs):
                setattr(instance, name, [f"{s.name}:{s.proportion}:{beside(s.path, base_dir)}" if s.path
                                         else f"{s.name}:{s.proportion}" for s in specs])


def parse_arguments(argv, *dataclass_types):
    """Parse an argument file + flags into the dataclasses and print the effective configuration.

    Returns (instances..., effective dict); exits with a one-line message on bad arguments.
    """
    global _argument_dir
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        instances = ArgumentParser(*dataclass_types).parse_args(argv, prog=program_name())
    except ArgumentError as err:
        fail(err)
    _argument_dir = os.path.dirname(os.path.abspath(argv[0])) if argv and not argv[0].startswith("-") else None
    if _argument_dir is not None:
        for instance in instances:
            paths_beside_the_file(instance, _argument_dir)
    effective = {key: ("<set>" if value and key.endswith("_token") else value)  # secrets stay out of logs
                 for key, value in to_dict(*instances).items()}
    if os.environ.get("PADDLE_TRAINER_ID", "0") == "0":  # under the launcher: rank 0 speaks for all
        print("effective arguments:\n" + json.dumps(effective, indent=2, sort_keys=True, default=str))
    return (*instances, effective)


def start_processes(train_args):
    """Start the process groups the launch and the parallel degrees ask for (fleet's hybrid groups for tensor /
    pipeline parallelism or sharding), before any model is built: models built afterwards are split accordingly.
    Then claim output_dir for this run (alignment/training/output_dir.py)."""
    from alignment.config.layout import plan
    from alignment.parallel.distributed import from_main_process, init_distributed, is_main_process, rank
    from alignment.parallel.watchdog import start_watchdog
    from alignment.training.output_dir import claim_output_dir

    try:
        layout = plan(train_args)
    except ValueError as err:
        fail(err)
    init_distributed(layout)
    if is_main_process():
        from alignment.cpu_env import describe

        print(describe())
    problem = None
    if is_main_process():
        try:
            claim_output_dir(train_args)
        except ValueError as err:
            problem = str(err)
    problem = from_main_process(problem)  # every rank stops at once, not at its first collective
    if problem:
        fail(ValueError(problem))
    if layout.world > 1:
        start_watchdog(rank(), layout.world, train_args.lost_rank_timeout)
        print(f"processes: {layout.describe()}")
    return layout


def load_raw(data_args, seed: int):
    """(train, eval or None) raw datasets from the argument specs; user modules are imported first.

    Bad specs or files raise DataFormatError / FileNotFoundError / ValueError: call it inside `user_errors()`.
    """
    import_user_modules(data_args.user_dataset_modules, base_dir=_argument_dir)
    train = MixedRawDataset(data_args.train_datasets, seed=seed)
    evaluation = MixedRawDataset(data_args.eval_datasets, seed=seed) if data_args.eval_datasets else None
    for name, dataset in (("train", train), ("eval", evaluation)):
        if dataset is not None:
            print(f"{name} data: " + ", ".join(f"{s.name} {s.selected}/{s.available}" for s in dataset.sources))
    return train, evaluation


def wall_time(seconds: float) -> str:
    """3725.4 -> '1h 02m 05s', 65 -> '1m 05s', 4.2 -> '4.2s'."""
    if seconds < 60:
        return f"{seconds:.1f}s"
    minutes, secs = divmod(int(round(seconds)), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h {minutes:02d}m {secs:02d}s" if hours else f"{minutes}m {secs:02d}s"


def where_to_look(train_args) -> str:
    """The stage's last lines: its wall time and how to look at its curves."""
    out = train_args.output_dir
    lines = [f"wall time: {wall_time(time.monotonic() - _STARTED)}",
             f"curves: python tools/plot_run.py {out}  (metrics: {os.path.join(out, 'metrics.jsonl')})"]
    if train_args.report_to == "visualdl":
        lines.append(f"dashboard: visualdl --logdir {os.path.join(out, 'visualdl')}")
    return "\n".join(lines)


def end_processes(train_args=None) -> None:
    """The last call of an entry point: rank 0 prints the wall time and where to look (`where_to_look`). A
    multi-process run ends here on every rank together (a barrier), marks itself done for the lost-rank watchdog,
    flushes its output and leaves without the interpreter's teardown: on the CPU build, gloo's and the TCP stores'
    destructors crashed a rank now and then (-11) after a complete run, once the other ranks were gone, and the
    launcher then failed the whole job. One process returns normally."""
    from alignment.parallel.distributed import barrier, is_main_process, world_size
    from alignment.parallel.watchdog import stop_watchdog

    if train_args is not None and is_main_process():
        print(where_to_look(train_args))
    if world_size() <= 1:
        return
    barrier()
    stop_watchdog()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
