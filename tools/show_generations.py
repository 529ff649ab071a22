"""Side by side: the eval generations of a PPO/GRPO run before training (step 0) and after (last step).

The command line of alignment/commands/show_generations.py (`python tools/show_generations.py --help`)."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # a checkout's `alignment`

from alignment.commands.show_generations import main  # noqa: E402
from alignment.exits import run_program  # noqa: E402

if __name__ == "__main__":
    sys.exit(run_program(main, uses_paddle=False))
