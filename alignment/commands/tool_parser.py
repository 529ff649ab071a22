"""The command-line parser of the tools (tools/*.py): argparse, with the stages' conventions.

- `--key-name` and `--key_name` are the same flag (the stages' argument files use underscores, argparse dashes);
- a flag is never abbreviated (`--mode` is not `--model`), and a bad one is one `error:` line, exit 2;
- a number is a number: a flag declared `type=int` takes integers that fit 64 bits, `type=float` finite numbers
  (NaN and inf are refused, one line naming the flag), as do the narrower types below;
- `--help` fits 100 columns: the tool's docstring is refilled paragraph by paragraph (prose and list items), while
  lines indented 4+ spaces (command examples, formulas) stay on their own lines, wrapped under their indentation
  only when longer; argparse's own text wraps at 100 too.
"""
from __future__ import annotations

import argparse
import math
import re
import sys
import textwrap
from typing import List, Optional, Sequence, Tuple

from alignment.inputs import INT64_MAX, INT64_MIN

WIDTH = 100


class _Formatter(argparse.RawDescriptionHelpFormatter):
    def __init__(self, prog: str):
        super().__init__(prog, width=WIDTH, max_help_position=32)

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        lines = []
        for own, words in paragraphs(text):
            follow = own + "    " if own.startswith("    ") else _continuation(own, words)
            lines += textwrap.wrap(words, width=WIDTH, initial_indent=own, subsequent_indent=follow,
                                   break_on_hyphens=False) or [""]
        return "\n".join(indent + line for line in lines)


_ITEM = re.compile(r"([-*]|\d+[.)])\s")


def _continuation(own: str, words: str) -> str:
    item = _ITEM.match(words)
    return own + " " * item.end() if item else own


def paragraphs(text: str) -> List[Tuple[str, str]]:
    """(indentation, text) per paragraph of a docstring. Prose lines and list items (with their continuation lines)
    are joined so they can be refilled to 100 columns; lines indented 4+ spaces (commands, formulas) stay alone."""
    out: List[Tuple[str, str]] = []
    joinable = False
    for line in text.splitlines():
        own, words = re.match(r"\s*", line).group(0), line.strip()
        if (joinable and words and not _ITEM.match(words) and not own.startswith("    ")
                and own == _continuation(out[-1][0], out[-1][1])):
            out[-1] = (out[-1][0], out[-1][1] + " " + words)
            continue
        out.append((own, words))
        joinable = bool(words) and not own.startswith("    ")
    return out


class ToolParser(argparse.ArgumentParser):
    """argparse.ArgumentParser(description=<the tool's docstring>) with the conventions above."""

    def __init__(self, description: str = "", **kwargs):
        kwargs.setdefault("formatter_class", _Formatter)
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(description=description.strip(), **kwargs)

    def error(self, message: str):
        """One line (argparse prints its usage first): the problem and where the flags are listed."""
        self.exit(2, f"error: {self.prog}: {message} (see {self.prog} --help)\n")

    def add_argument(self, *names, **kwargs):
        """Long options are declared with dashes whatever the tool wrote (`--is_rm` -> `--is-rm`, dest `is_rm`);
        `type=int` / `type=float` become `integer` / `finite_number`."""
        kwargs["type"] = {int: integer, float: finite_number}.get(kwargs.get("type"), kwargs.get("type"))
        if kwargs["type"] is None:
            del kwargs["type"]
        return super().add_argument(*(dashed(names) if names and names[0].startswith("-") else names), **kwargs)

    def parse_known_args(self, args: Optional[Sequence[str]] = None, namespace=None):
        return super().parse_known_args(dashed(args), namespace)

    def add_listen_arguments(self, default_port: int) -> None:
        """--host (loopback by default), --port (0: any free one) and --port-file, for the tools that serve HTTP;
        check them with check_listen."""
        self.add_argument("--host", default="127.0.0.1", help="address to listen on (default loopback only)")
        self.add_argument("--port", type=int, default=default_port,
                          help="port (0 = any free port; the address is printed)")
        self.add_argument("--port-file", help="also write the bound port to this file once listening")

    def check_listen(self, args) -> None:
        if not 0 <= args.port <= 65535:
            self.error(f"--port must be in 0..65535 (0: any free port), got {args.port}")


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


def _checked(convert, accept, wanted: str, name: str):
    """An argparse type: `convert(text)` when `accept` takes the value, else one line saying what was wanted."""
    def parse(text: str):
        try:
            value = convert(text)
        except OverflowError:
            raise argparse.ArgumentTypeError(f"must be {wanted} that fits 64 bits, got {text!r}") from None
        except ValueError:
            value = None
        if value is None or not accept(value):
            raise argparse.ArgumentTypeError(f"must be {wanted}, got {text!r}")
        return value

    parse.__name__ = name
    return parse


def _int64(text: str) -> int:
    value = int(text)
    if not INT64_MIN <= value <= INT64_MAX:
        raise OverflowError(text)
    return value


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(text)
    return value


integer = _checked(_int64, lambda v: True, "an integer", "integer")
finite_number = _checked(_finite, lambda v: True, "a finite number", "finite_number")
positive_int = _checked(_int64, lambda v: v >= 1, "an integer >= 1", "positive_int")
non_negative_int = _checked(_int64, lambda v: v >= 0, "an integer >= 0", "non_negative_int")
positive_number = _checked(_finite, lambda v: v > 0, "a finite number > 0", "positive_number")
non_negative_number = _checked(_finite, lambda v: v >= 0, "a finite number >= 0", "non_negative_number")
def int_range(low: int, high: int):
    """An argparse type: an integer in [low, high]."""
    return _checked(_int64, lambda v: low <= v <= high, f"an integer in [{low:,}, {high:,}]", "int_range")


fraction = _checked(_finite, lambda v: 0 <= v < 1, "a number in [0, 1)", "fraction")
probability = _checked(_finite, lambda v: 0 < v <= 1, "a number in (0, 1]", "probability")
