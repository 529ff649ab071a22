"""`python -m alignment.dpo ARGS.{json,yaml} [--key value ...]`: the same as `python alignment/dpo/run_dpo.py ...`."""
import sys

from alignment.exits import run_program
from alignment.dpo.run_dpo import main

sys.exit(run_program(main))  # main() returns the run's results to callers; a program exits with a status
