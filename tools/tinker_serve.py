"""Serve the Tinker training API (the `tinker` SDK's clients) on this project's LLaMA with LoRA.

The command line of alignment/commands/tinker_serve.py (`python tools/tinker_serve.py --help`)."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # a checkout's `alignment`

from alignment.commands.tinker_serve import main  # noqa: E402
from alignment.exits import run_program  # noqa: E402

if __name__ == "__main__":
    sys.exit(run_program(main))
