"""Merge LoRA adapters (PEFT layout) into their base model and write a full Hugging Face-layout checkpoint.

The command line of alignment/commands/merge_lora.py (`python tools/merge_lora.py --help`)."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # a checkout's `alignment`

from alignment.commands.merge_lora import main  # noqa: E402
from alignment.exits import run_program  # noqa: E402

if __name__ == "__main__":
    sys.exit(run_program(main))
