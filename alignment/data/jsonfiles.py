"""Reading local JSON / JSONL data files with `datasets`, and locating the exact line of a bad record.

`datasets`/pyarrow report parse failures without a line number; when they fail, the file is re-scanned here
so the error can name `file line N` and the problem.
"""
from __future__ import annotations

import bisect
import contextlib
import glob
import gzip
import json
import os
import re
from typing import Any, Iterator

import datasets

from alignment.data.raw import DataFormatError

DATA_SUFFIXES = (".jsonl", ".json", ".jsonl.gz", ".json.gz")
_WHITESPACE = re.compile(r"\s*")


@contextlib.contextmanager
def quiet_datasets() -> Iterator[None]:
    """No progress bars or parse-error logging from ``datasets`` while reading local files."""
    bars_were_on = datasets.is_progress_bar_enabled()
    verbosity = datasets.logging.get_verbosity()
    datasets.disable_progress_bars()
    datasets.logging.set_verbosity(datasets.logging.CRITICAL)
    try:
        yield
    finally:
        datasets.logging.set_verbosity(verbosity)
        if bars_were_on:
            datasets.enable_progress_bars()


def resolve_data_files(path: str | os.PathLike, split: str) -> list[str]:
    """A file path as is; for a directory, its ``<split>.jsonl|.json[.gz]`` files (top level
    first, else anywhere below, e.g. a cloned hub repo's ``data/*/train.jsonl``)."""
    path = os.fspath(path)
    if os.path.isfile(path):
        return [path]
    if not os.path.isdir(path):
        raise FileNotFoundError(f"Data path {path!r} does not exist")
    names = [split + suffix for suffix in DATA_SUFFIXES]
    for pattern in ("", "**"):
        found = sorted({f for name in names for f in glob.glob(os.path.join(path, pattern, name), recursive=True)})
        if found:
            return found
    raise FileNotFoundError(f"No {split!r} data file in directory {path!r} (looked for {', '.join(names)})")


class UnreadableJsonError(DataFormatError):
    """``datasets`` failed on a file whose rows are all valid JSON objects; ``records``
    holds them as ``(line, row)`` so a loader can still point at a bad row."""

    def __init__(self, message: str, path: str, line: int | None, records: list[tuple[int, dict]]):
        super().__init__(message, path, line)
        self.records = records


def load_json_file(path: str) -> list[dict[str, Any]]:
    """Rows of a local JSON/JSONL file read with ``datasets``; parse problems name the line."""
    try:
        with quiet_datasets():
            rows = datasets.load_dataset("json", data_files=path, split="train").to_list()
    except Exception as error:  # datasets/pyarrow raise many types; locate the problem ourselves
        records = scan_records(path)  # raises DataFormatError with the line when it finds the problem
        line, problem = _first_type_change(records) or (None, "every row is valid JSON")
        where = f"{path} line {line}" if line else path
        message = f"{where}: {problem}; datasets could not read the file ({type(error).__name__}: {error})"
        raise UnreadableJsonError(message, path, line, records) from error
    if not rows:
        raise DataFormatError(f"{path}: the file has no rows", path=path)
    return rows


def _first_type_change(records: list[tuple[int, dict]]) -> tuple[int, str] | None:
    """The first value whose JSON type differs from the same key's type on an earlier row."""
    first_seen: dict[str, tuple[str, int]] = {}
    for line, record in records:
        for key, value in record.items():
            if value is not None:
                kind, first_line = first_seen.setdefault(key, (json_type_name(value), line))
                if kind != json_type_name(value):
                    return line, f"{key!r} is {json_type_name(value)} here but {kind} on line {first_line}"
    return None


def _read_bytes(path: str) -> bytes:
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rb") as handle:
        return handle.read()


def scan_records(path: str) -> list[tuple[int, Any]]:
    """(line, value) of each top-level JSON row: JSONL, or the elements of a JSON array."""
    data = _read_bytes(path)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as error:
        line = data.count(b"\n", 0, error.start) + 1
        column = error.start - (data.rfind(b"\n", 0, error.start) + 1) + 1
        message = f"{path} line {line}: not valid UTF-8 (byte 0x{data[error.start]:02x} at column {column})"
        raise DataFormatError(message, path, line) from None
    records = _scan_json_values(path, text.replace("\ufeff", " ", 1) if text.startswith("\ufeff") else text)
    if not records:
        raise DataFormatError(f"{path}: the file has no rows", path=path)
    for line, value in records:
        if not isinstance(value, dict):
            raise DataFormatError(f"{path} line {line}: expected a JSON object, got {json_type_name(value)}", path, line)
    return records


def _scan_json_values(path: str, text: str) -> list[tuple[int, Any]]:
    decoder = json.JSONDecoder()
    newlines = [match.start() for match in re.finditer("\n", text)]

    def line_of(pos: int) -> int:
        return bisect.bisect_left(newlines, pos) + 1

    pos = _WHITESPACE.match(text).end()
    is_array = text.startswith("[", pos)
    if is_array:
        pos = _WHITESPACE.match(text, pos + 1).end()
    records: list[tuple[int, Any]] = []
    while pos < len(text) and not (is_array and text[pos] == "]"):
        line = line_of(pos)
        try:
            value, pos = decoder.raw_decode(text, pos)
        except json.JSONDecodeError as error:
            where = f"column {error.colno}" if error.lineno == line else f"line {error.lineno} column {error.colno}"
            raise DataFormatError(f"{path} line {line}: invalid JSON: {error.msg} ({where})", path, line) from None
        except RecursionError:
            raise DataFormatError(f"{path} line {line}: JSON nested too deeply to be a data row", path, line) from None
        records.append((line, value))
        pos = _WHITESPACE.match(text, pos).end()
        if is_array and text.startswith(",", pos):
            pos = _WHITESPACE.match(text, pos + 1).end()
        elif is_array and not text.startswith("]", pos):
            line = line_of(min(pos, len(text)))
            raise DataFormatError(f"{path} line {line}: invalid JSON: expected ',' or ']' in the array", path, line)
    return records


def json_type_name(value: Any) -> str:
    return {dict: "an object", list: "an array", str: "a string", bool: "a boolean", type(None): "null"}.get(
        type(value), "a number"
    )
