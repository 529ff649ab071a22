"""MkDocs hook (mkdocs.yml `hooks:`): the build fails when a generated part of a page is stale, so the site never
shows a key table or a figure that differs from the code's tables and the result files."""
import os
import sys

from mkdocs.exceptions import PluginError

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from docsgen import blocks  # noqa: E402


def on_pre_build(config, **kwargs):
    stale = blocks.stale()
    if stale:
        raise PluginError("stale generated parts (run python -m docsgen): " +
                          ", ".join(f"{page} '{part}'" for page, part in stale))
