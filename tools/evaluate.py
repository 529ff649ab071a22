"""Evaluate a policy on held-out tasks: pass@k, maj@k, mean@k with bootstrap 95% confidence intervals.

The command line of alignment/commands/evaluate.py (`python tools/evaluate.py --help`)."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # a checkout's `alignment`

from alignment.commands.evaluate import main  # noqa: E402
from alignment.exits import run_program  # noqa: E402

if __name__ == "__main__":
    sys.exit(run_program(main))
