"""`python -m alignment.sft ARGS.{json,yaml} [--key value ...]`: the same as `python alignment/sft/run_sft.py ...`."""
import sys

from alignment.exits import run_program
from alignment.sft.run_sft import main

sys.exit(run_program(main))  # main() returns the run's results to callers; a program exits with a status
