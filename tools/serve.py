"""Serve a trained model to any OpenAI or Anthropic client (POST /v1/chat/completions, /v1/responses,
/v1/messages; GET /v1/models).

The command line of alignment/commands/serve.py (`python tools/serve.py --help`)."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # a checkout's `alignment`

from alignment.commands.serve import main  # noqa: E402
from alignment.exits import run_program  # noqa: E402

if __name__ == "__main__":
    sys.exit(run_program(main))
