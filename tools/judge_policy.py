"""Score a policy's greedy answers to held-out prompts with an offline gold judge, the way PPO's evaluation does.

The command line of alignment/commands/judge_policy.py (`python tools/judge_policy.py --help`)."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # a checkout's `alignment`

from alignment.commands.judge_policy import main  # noqa: E402
from alignment.exits import run_program  # noqa: E402

if __name__ == "__main__":
    sys.exit(run_program(main))
