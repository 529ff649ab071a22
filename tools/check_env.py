"""Play a few episodes of an environment with a random policy and report what would fail in training.

The command line of alignment/commands/check_env.py (`python tools/check_env.py --help`)."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # a checkout's `alignment`

from alignment.commands.check_env import main  # noqa: E402
from alignment.exits import run_program  # noqa: E402

if __name__ == "__main__":
    sys.exit(run_program(main, uses_paddle=False))
