"""Export a trained policy for inference: an HF-layout checkpoint and a static program with a KV cache.

The command line of alignment/commands/export_model.py (`python tools/export_model.py --help`)."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # a checkout's `alignment`

from alignment.commands.export_model import main  # noqa: E402
from alignment.exits import run_program  # noqa: E402

if __name__ == "__main__":
    sys.exit(run_program(main))
