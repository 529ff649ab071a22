"""Generate text from an HF-layout checkpoint with our Paddle model (KV-cache sampling).

The command line of alignment/commands/generate.py (`python tools/generate.py --help`)."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # a checkout's `alignment`

from alignment.commands.generate import main  # noqa: E402
from alignment.exits import run_program  # noqa: E402

if __name__ == "__main__":
    sys.exit(run_program(main))
