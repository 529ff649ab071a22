"""Plan a process layout (tensor x pipeline x sharding x data) for a LLaMA-family model: memory per GPU, per phase.

The command line of alignment/commands/plan_layout.py (`python tools/plan_layout.py --help`)."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # a checkout's `alignment`

from alignment.commands.plan_layout import main  # noqa: E402
from alignment.exits import run_program  # noqa: E402

if __name__ == "__main__":
    sys.exit(run_program(main, uses_paddle=False))
