"""The command-line parser of the tools (tools/*.py): argparse, with the stages' conventions.

- `--key-name` and `--key_name` are the same flag (the stages' argument files use underscores, argparse dashes);
- `--help` fits 100 columns: the tool's docstring is kept as written (its command examples stay on their lines)
  and any longer line is wrapped under its own indentation; argparse's own text wraps at 100 too.
"""
from __future__ import annotations

import argparse
import re
import sys
import textwrap
from typing import List, Optional, Sequence

WIDTH = 100


class _Formatter(argparse.RawDescriptionHelpFormatter):
    def __init__(self, prog: str):
        super().__init__(prog, width=WIDTH, max_help_position=32)

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        lines = []
        for line in text.splitlines():
            own = re.match(r"\s*", line).group(0)
            lines += textwrap.wrap(line, width=WIDTH, initial_indent="", subsequent_indent=own + "    ") or [""]
        return "\n".join(indent + line for line in lines)


class ToolParser(argparse.ArgumentParser):
    """argparse.ArgumentParser(description=<the tool's docstring>) with the conventions above."""

    def __init__(self, description: str = "", **kwargs):
        kwargs.setdefault("formatter_class", _Formatter)
        super().__init__(description=description.strip(), **kwargs)

    def add_argument(self, *names, **kwargs):
        """Long options are declared with dashes whatever the tool wrote (`--is_rm` -> `--is-rm`, dest `is_rm`)."""
        return super().add_argument(*(dashed(names) if names and names[0].startswith("-") else names), **kwargs)

    def parse_known_args(self, args: Optional[Sequence[str]] = None, namespace=None):
        return super().parse_known_args(dashed(args), namespace)


def dashed(args: Optional[Sequence[str]]) -> List[str]:
    """['--max_new_tokens', '8', '--out_dir=x', 'a_b'] -> ['--max-new-tokens', '8', '--out-dir=x', 'a_b']: only the
    names of long options change, never values."""
    if args is None:
        args = sys.argv[1:]
    out = []
    for arg in args:
        if arg.startswith("--") and len(arg) > 2:
            name, sep, value = arg[2:].partition("=")
            arg = "--" + name.replace("_", "-") + sep + value
        out.append(arg)
    return out
