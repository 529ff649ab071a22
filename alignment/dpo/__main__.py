"""`python -m alignment.dpo ARGS.{json,yaml} [--key value ...]`: the same as `python alignment/dpo/run_dpo.py ...`."""
from alignment import entry
from alignment.dpo.run_dpo import main

entry.run(main)  # main() returns the run's results to callers; a program exits with a status
