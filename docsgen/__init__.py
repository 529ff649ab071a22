"""The documentation's generated parts and checks (not installed with the package): tables made from the code's own
tables and from benchmark result files (`blocks.py`), the MkDocs hook that fails a build whose generated parts are
stale (`hooks.py`), and the reader of the runnable shell blocks the docs test runs (`runnable.py`).
`python -m docsgen` rewrites the generated parts; `python -m docsgen --check` only reports stale ones."""
