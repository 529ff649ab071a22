"""`python -m alignment.rm ARGS.{json,yaml} [--key value ...]`: the same as `python alignment/rm/run_reward.py ...`."""
import sys

from alignment.exits import run_program
from alignment.rm.run_reward import main

sys.exit(run_program(main))  # main() returns the run's results to callers; a program exits with a status
