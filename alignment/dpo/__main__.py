"""`python -m alignment.dpo ARGS.{json,yaml} [--key value ...]`: the same as `python alignment/dpo/run_dpo.py ...`."""
from alignment.dpo.run_dpo import main

main()  # returns the run's results to callers; as a program it exits 0 here
