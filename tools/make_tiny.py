"""Create a tiny random LLaMA and its tokenizer locally (no downloads, a few seconds) for smoke runs and tests.

The command line of alignment/commands/make_tiny.py (`python tools/make_tiny.py --help`)."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # a checkout's `alignment`

from alignment.commands.make_tiny import main  # noqa: E402
from alignment.exits import run_program  # noqa: E402

if __name__ == "__main__":
    sys.exit(run_program(main))
