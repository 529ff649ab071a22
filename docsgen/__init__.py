"""The documentation's generated parts and checks (not installed with the package): tables made from the code's own
tables and from benchmark result files (`blocks.py`), the configuration reference and the extension classes made
from the argument classes, the stages' parsers and the registries (`key_reference.py`), the MkDocs hook that fails
a build whose generated parts are stale (`hooks.py`), the reader of the runnable shell blocks the docs test runs
(`runnable.py`), and the check of the docs' claims against the repository (`claims.py`: flags, keys, paths,
hand-typed figures, cut paragraphs, machine paths, peer versions; `python -m docsgen.claims`,
tests/docs/test_docs_claims.py).
`python -m docsgen` rewrites the generated parts; `python -m docsgen --check` only reports stale ones."""


def _register() -> None:
    """Add key_reference's generated parts to blocks.GENERATORS (the modules import their heavy parts lazily)."""
    from docsgen import blocks, key_reference

    blocks.GENERATORS.update(key_reference.GENERATORS)


_register()
