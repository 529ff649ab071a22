"""The preamble every stage's entry point shares (sft/run_sft.py, rm/run_reward.py, dpo/run_dpo.py, dpo/run_kto.py,
ppo/run_ppo.py, ppo/run_distill.py), so none repeats it.

A script keeps only what must come before any `alignment` import: run as `python alignment/<stage>/run_*.py` from a
checkout (no `__package__`), it puts the checkout on sys.path. Then it imports this module first, which applies this
CPU's thread and MKL settings (cpu_env.apply_cpu_defaults) before anything imports paddle, and ends with
`entry.run(main)` under its main guard: the stage's main() run as a program (exits.run_program: the exit status,
one line on error). Importing `alignment` itself still changes no process settings; importing this module does, so
only entry points import it.

    if not __package__:  # run as a script from a checkout: make `alignment` importable
        sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

    from alignment import entry  # noqa: E402  first: the CPU settings, before paddle is imported
    ...
    if __name__ == "__main__":
        entry.run(main)
"""
from __future__ import annotations

import sys
from typing import Callable, NoReturn

from alignment.cpu_env import apply_cpu_defaults

apply_cpu_defaults()  # this CPU's thread and MKL settings, before paddle is imported


def run(main: Callable[[], object]) -> NoReturn:
    """Run a stage's main() as a program and exit with its status (main() returns its results to callers)."""
    from alignment.exits import run_program

    sys.exit(run_program(main))
