"""`python -m alignment.ppo ARGS.{json,yaml} [--key value ...]`: the same as `python alignment/ppo/run_ppo.py ...`."""
from alignment import entry
from alignment.ppo.run_ppo import main

entry.run(main)  # main() returns the run's results to callers; a program exits with a status
