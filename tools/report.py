"""Write a run's report.md and its plots (the metrics by family, the monitors' events).

The command line of alignment/commands/report.py (`python tools/report.py --help`)."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # a checkout's `alignment`

from alignment.commands.report import main  # noqa: E402
from alignment.exits import run_program  # noqa: E402

if __name__ == "__main__":
    sys.exit(run_program(main, uses_paddle=False))
