"""Local JSON / JSONL data files: which files a path names, and their rows with the line each starts on.

Rows are read by the shared reader (alignment/inputs): Python's JSON parser keeps every value's type as written,
so a typed field given as a string ("0", "true") reaches the format's check instead of being cast by a columnar
reader, and what is wrong with the file itself (gzip bytes, another format, an encoding, JSON nested too deeply, a
key given twice, a lone surrogate escape) is one line naming the file and line.
"""
from __future__ import annotations

import glob
import os
from typing import Any

from alignment.inputs import InputError, json_type_name, json_values
from alignment.data.errors import DataFormatError

__all__ = ["DATA_SUFFIXES", "json_type_name", "load_json_file", "resolve_data_files", "scan_records"]

DATA_SUFFIXES = (".jsonl", ".json", ".jsonl.gz", ".json.gz")


def resolve_data_files(path: str | os.PathLike, split: str) -> list[str]:
    """A file path as is; for a directory, its ``<split>.jsonl|.json[.gz]`` files (top level
    first, else anywhere below, e.g. a cloned hub repo's ``data/*/train.jsonl``)."""
    path = os.fspath(path)
    if os.path.isdir(path):
        names = [split + suffix for suffix in DATA_SUFFIXES]
        for pattern in ("", "**"):
            found = sorted({f for name in names for f in glob.glob(os.path.join(path, pattern, name),
                                                                   recursive=True)})
            if found:
                return found
        raise FileNotFoundError(f"No {split!r} data file in directory {path!r} (looked for {', '.join(names)})")
    if not os.path.lexists(path):
        raise FileNotFoundError(f"Data path {path!r} does not exist")
    return [path]  # anything else (a pipe, a device) is refused by the reader, by name


def scan_records(path: str) -> list[tuple[int, dict[str, Any]]]:
    """(line, row) of each top-level JSON row: JSONL, or the elements of a JSON array; every row an object."""
    try:
        records = json_values(path, "data file")
    except InputError as err:  # the data layer's one error type, for callers that catch it
        raise DataFormatError(str(err), err.path, err.line) from None
    if not records:
        raise DataFormatError(f"{path}: the file has no rows", path=path)
    for line, value in records:
        if not isinstance(value, dict):
            raise DataFormatError(f"{path} line {line}: expected a JSON object, got {json_type_name(value)}", path,
                                  line)
    return records


def load_json_file(path: str) -> list[dict[str, Any]]:
    """The rows of a local JSON / JSONL file (see scan_records)."""
    return [row for _, row in scan_records(path)]
