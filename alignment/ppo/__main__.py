"""`python -m alignment.ppo ARGS.{json,yaml} [--key value ...]`: the same as `python alignment/ppo/run_ppo.py ...`."""
from alignment.ppo.run_ppo import main

main()  # returns the run's results to callers; as a program it exits 0 here
