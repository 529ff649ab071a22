"""`python -m alignment.ppo ARGS.{json,yaml} [--key value ...]`: the same as `python alignment/ppo/run_ppo.py ...`."""
import sys

from alignment.exits import run_program
from alignment.ppo.run_ppo import main

sys.exit(run_program(main))  # main() returns the run's results to callers; a program exits with a status
