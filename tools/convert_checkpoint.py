"""Convert a PaddleNLP-written LLaMA / Qwen2 checkpoint into this project's Hugging Face layout.

The command line of alignment/commands/convert_checkpoint.py (`python tools/convert_checkpoint.py --help`)."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # a checkout's `alignment`

from alignment.commands.convert_checkpoint import main  # noqa: E402
from alignment.exits import run_program  # noqa: E402

if __name__ == "__main__":
    sys.exit(run_program(main))
