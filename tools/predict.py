"""Generate for many prompts with an exported model (tools/export_model.py) through paddle.inference.

The command line of alignment/commands/predict.py (`python tools/predict.py --help`)."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # a checkout's `alignment`

from alignment.commands.predict import main  # noqa: E402
from alignment.exits import run_program  # noqa: E402

if __name__ == "__main__":
    sys.exit(run_program(main))
