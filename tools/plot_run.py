"""Draw a run's curves from its metrics.jsonl into one PNG, and print each curve's trend in words.

The command line of alignment/commands/plot_run.py (`python tools/plot_run.py --help`)."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # a checkout's `alignment`

from alignment.commands.plot_run import main  # noqa: E402
from alignment.exits import run_program  # noqa: E402

if __name__ == "__main__":
    sys.exit(run_program(main, uses_paddle=False))
