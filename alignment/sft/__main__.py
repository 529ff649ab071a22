"""`python -m alignment.sft ARGS.{json,yaml} [--key value ...]`: the same as `python alignment/sft/run_sft.py ...`."""
from alignment.sft.run_sft import main

main()  # returns the run's results to callers; as a program it exits 0 here
