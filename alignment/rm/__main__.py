"""`python -m alignment.rm ARGS.{json,yaml} [--key value ...]`: the same as `python alignment/rm/run_reward.py ...`."""
from alignment.rm.run_reward import main

main()  # returns the run's results to callers; as a program it exits 0 here
