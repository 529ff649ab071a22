"""Reward over-optimisation, as Gao et al. (2022) plot it: proxy reward (the trained reward model) and gold reward

The command line of alignment/commands/plot_overoptimization.py (`python tools/plot_overoptimization.py --help`)."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # a checkout's `alignment`

from alignment.commands.plot_overoptimization import main  # noqa: E402
from alignment.exits import run_program  # noqa: E402

if __name__ == "__main__":
    sys.exit(run_program(main, uses_paddle=False))
