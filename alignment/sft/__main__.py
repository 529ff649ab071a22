"""`python -m alignment.sft ARGS.{json,yaml} [--key value ...]`: the same as `python alignment/sft/run_sft.py ...`."""
from alignment import entry
from alignment.sft.run_sft import main

entry.run(main)  # main() returns the run's results to callers; a program exits with a status
