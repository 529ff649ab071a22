"""Convert a GGUF file (LLaMA, Qwen2, Qwen3, Qwen3-MoE, ERNIE 4.5 dense or MoE) into a Hugging Face checkpoint
directory, tokenizer included.

The command line of alignment/commands/import_gguf.py (`python tools/import_gguf.py --help`)."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # a checkout's `alignment`

from alignment.commands.import_gguf import main  # noqa: E402
from alignment.exits import run_program  # noqa: E402

if __name__ == "__main__":
    sys.exit(run_program(main))
