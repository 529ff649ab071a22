"""Write verifiable prompts (and worked solutions) from reasoning-gym's procedural tasks as JSONL.

The command line of alignment/commands/make_reasoning_data.py (`python tools/make_reasoning_data.py --help`)."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # a checkout's `alignment`

from alignment.commands.make_reasoning_data import main  # noqa: E402
from alignment.exits import run_program  # noqa: E402

if __name__ == "__main__":
    sys.exit(run_program(main))
