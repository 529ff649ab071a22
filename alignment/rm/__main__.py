"""`python -m alignment.rm ARGS.{json,yaml} [--key value ...]`: the same as `python alignment/rm/run_reward.py ...`."""
from alignment import entry
from alignment.rm.run_reward import main

entry.run(main)  # main() returns the run's results to callers; a program exits with a status
