"""The command-line programs other than the training stages: one module per program, each with its argparse `main()`
(help text = the module docstring). The console commands (alignment/cli.py) and the checkout's tools/*.py scripts
run these; the library code they call lives in the packages below them (inference, planning, models.convert, ...)."""
