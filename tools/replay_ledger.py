"""A report of a run's rollout ledger: what the policy saw when, every sample trained once.

The command line of alignment/commands/replay_ledger.py (`python tools/replay_ledger.py --help`)."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # a checkout's `alignment`

from alignment.commands.replay_ledger import main  # noqa: E402
from alignment.exits import run_program  # noqa: E402

if __name__ == "__main__":
    sys.exit(run_program(main, uses_paddle=False))
