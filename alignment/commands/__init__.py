"""The command-line programs other than the training stages: one module per program, each with its argparse `main()`
(help text = the module docstring). The console commands (alignment/cli.py) and the checkout's tools/*.py scripts
run these; the library code they call lives in the packages below them (inference, planning, models.convert, ...).
Importing any of them first applies this CPU's settings (alignment/cpu_env.py), as the stages' scripts do."""
from __future__ import annotations

from typing import Callable

from alignment.cpu_env import apply_cpu_defaults

apply_cpu_defaults()  # this CPU's thread and MKL settings, before any program here imports paddle


def add_output(parser, help: str) -> None:
    """--output (required) and --overwrite, for a program that writes a checkpoint directory."""
    parser.add_argument("--output", required=True, help=help)
    parser.add_argument("--overwrite", action="store_true", help="replace what is at --output already")


def write_output(args, produce: Callable[[], str], done: Callable[[str], str]) -> str:
    """`produce()`, which writes args.output and returns its path, unless something is there already and
    --overwrite was not given; then prints `done(path)`. Bad input (a checkpoint, an argument) is one line naming
    it, exit 2."""
    from alignment.fileio import refuse_to_replace
    from alignment.training.setup import user_errors

    with user_errors():
        refuse_to_replace(args.output, args.overwrite)
        path = produce()
    print(done(path))
    return path
