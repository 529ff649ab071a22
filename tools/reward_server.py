"""Serve a reward model and/or judges over HTTP (PaddleNLP's `POST /` and OpenRLHF's `POST /get_reward`).

The command line of alignment/commands/reward_server.py (`python tools/reward_server.py --help`)."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # a checkout's `alignment`

from alignment.commands.reward_server import main  # noqa: E402
from alignment.exits import run_program  # noqa: E402

if __name__ == "__main__":
    sys.exit(run_program(main))
