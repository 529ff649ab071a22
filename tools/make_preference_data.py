"""Build judge-labelled preference pairs: sample two responses per prompt from a policy, score both with a gold

The command line of alignment/commands/make_preference_data.py (`python tools/make_preference_data.py --help`)."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # a checkout's `alignment`

from alignment.commands.make_preference_data import main  # noqa: E402
from alignment.exits import run_program  # noqa: E402

if __name__ == "__main__":
    sys.exit(run_program(main))
