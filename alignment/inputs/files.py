"""Files a user hands a program, read whole: the file, how it is stored, its text and its JSON (see the package
docstring)."""
from __future__ import annotations

import bisect
import json
import os
import re
import stat
import sys
import zlib
from typing import Any, List, Optional, Tuple

MAX_INPUT_BYTES = 8 << 30  # a file read whole (after decompression): beyond this it is not an input of ours
_MAGIC = ((b"PK\x03\x04", "a zip archive"), (b"GGUF\x02\x00\x00\x00", "a GGUF model file"),
          (b"GGUF\x03\x00\x00\x00", "a GGUF model file"), (b"ARROW1\x00\x00", "Arrow data"),
          (b"\x89HDF\r\n", "HDF5 data"), (b"\xfd7zXZ\x00", "xz-compressed data"), (b"(\xb5/\xfd", "zstd data"),
          *((bytes([0x80, v]), "a Python pickle") for v in range(2, 6)))  # none of them starts a UTF-8 text
_OTHER_FORMATS = {".csv": "a CSV file", ".tsv": "a TSV file", ".parquet": "a Parquet file", ".arrow": "an Arrow file",
                  ".xlsx": "a spreadsheet", ".pkl": "a pickle", ".pickle": "a pickle"}
_UTF16_32 = ((b"\xff\xfe\x00\x00", "UTF-32"), (b"\x00\x00\xfe\xff", "UTF-32"), (b"\xff\xfe", "UTF-16"),
             (b"\xfe\xff", "UTF-16"))
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F][0-9a-fA-F]{2}")
_WHITESPACE = re.compile(r"\s*")


class InputError(ValueError):
    """A file (or a value in it) a program cannot use; the message starts with where: `path line N: ...`."""

    def __init__(self, message: str, path: Optional[str] = None, line: Optional[int] = None):
        super().__init__(message)
        self.path, self.line = path, line


def where(path, line: Optional[int] = None) -> str:
    return f"{path} line {line}" if line else str(path)


def a(what: str) -> str:
    """'an argument file', 'a data file'."""
    return f"{'an' if what[:1] in 'aeiou' else 'a'} {what}"


# --------------------------------------------------------------------------- bytes and text


def read_bytes(path, what: str = "file", limit: int = MAX_INPUT_BYTES) -> bytes:
    """The bytes of a regular file (a .gz file decompressed), at most `limit` of them."""
    path = os.fspath(path)
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        raise FileNotFoundError(f"{path}: no such {what}") from None
    except OSError as err:
        raise InputError(f"{path}: cannot read the {what} ({err.strerror})", path) from None
    if stat.S_ISDIR(mode):
        raise InputError(f"{path}: a directory, not {a(what)}", path)
    if not stat.S_ISREG(mode):
        raise InputError(f"{path}: not a regular file (a pipe, socket or device); give the {what} itself", path)
    if os.path.getsize(path) > limit:
        raise InputError(f"{path}: {os.path.getsize(path):,} bytes, larger than {a(what)} may be ({limit:,})", path)
    try:
        with open(path, "rb") as f:
            data = read_at_most(f, limit + 1)
    except OSError as err:
        raise InputError(f"{path}: cannot read the {what} ({err.strerror})", path) from None
    if path.endswith(".gz"):
        return _gunzip(data, path, limit)
    if data[:2] == b"\x1f\x8b":
        raise InputError(f"{path}: gzip-compressed data in a file not named .gz; decompress it or name it "
                         f"{os.path.basename(path)}.gz", path)
    return data


def read_at_most(f, count: int, chunk: int = 1 << 20):
    """Up to `count` bytes (characters, from a text file) of `f`, read a chunk at a time: `f.read(count)` allocates
    `count` bytes before reading one, which under an address-space limit (`ulimit -v`) is a MemoryError for a large
    limit and a small file."""
    parts, got = [], 0
    while got < count:
        part = f.read(min(chunk, count - got))
        if not part:
            break
        parts.append(part)
        got += len(part)
    return parts[0][:0].join(parts) if parts else f.read(0)


def _gunzip(data: bytes, path: str, limit: int) -> bytes:
    """Every gzip member of `data` (`cat a.gz b.gz` writes several), at most `limit` bytes out."""
    out, rest = b"", data
    if rest[:2] != b"\x1f\x8b":
        raise InputError(f"{path}: named .gz but not gzip data; compress it or drop the .gz", path)
    while rest[:2] == b"\x1f\x8b":
        reader = zlib.decompressobj(wbits=31)
        try:
            out += reader.decompress(rest, limit + 1 - len(out))
        except zlib.error as err:
            raise InputError(f"{path}: broken gzip data ({err})", path) from None
        if len(out) > limit:
            raise InputError(f"{path}: decompresses to more than {limit:,} bytes", path)
        if not reader.eof:
            raise InputError(f"{path}: broken gzip data (the stream ends early: a truncated file?)", path)
        rest = reader.unused_data
    if rest.strip(b"\x00"):
        raise InputError(f"{path}: broken gzip data (bytes after the last gzip stream)", path)
    return out


def read_text(path, what: str = "file", limit: int = MAX_INPUT_BYTES) -> str:
    """The UTF-8 text of a file (a leading byte-order mark dropped); what is not UTF-8 text is named."""
    path = os.fspath(path)
    data = read_bytes(path, what, limit)
    return decode_text(data, path, what)


def decode_text(data: bytes, path: str, what: str = "file") -> str:
    for mark, encoding in _UTF16_32:
        if data.startswith(mark):
            raise InputError(f"{path}: {encoding} text (it starts with a byte-order mark); save the {what} as UTF-8",
                             path)
    kind = next((kind for magic, kind in _MAGIC if data.startswith(magic)), None)
    if data.startswith(b"PAR1") and data.endswith(b"PAR1") and len(data) > 8:
        kind = "Parquet data"
    if kind:
        raise InputError(f"{path}: {kind}, not the text of {a(what)}", path)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:
        line = data.count(b"\n", 0, err.start) + 1
        column = err.start - (data.rfind(b"\n", 0, err.start) + 1) + 1
        raise InputError(f"{path} line {line}: not valid UTF-8 (byte 0x{data[err.start]:02x} at column {column})",
                         path, line) from None
    return text[1:] if text.startswith("\ufeff") else text


def other_format(path) -> Optional[str]:
    """'a CSV file' when the name says the file is in a format that is not JSON, else None."""
    name = os.fspath(path).lower()
    return next((kind for suffix, kind in _OTHER_FORMATS.items() if name.endswith(suffix)), None)


def read_json_text(path, what: str, limit: int) -> str:
    """The text of a file that must hold JSON: a name saying another format (data.csv) is refused first."""
    kind = other_format(path)
    if kind:
        raise InputError(f"{path}: {kind}; {a(what)} is JSON or JSON lines (one object per line)", os.fspath(path))
    return read_text(path, what, limit)


# --------------------------------------------------------------------------- JSON


def _unique_keys(pairs):
    out = dict(pairs)
    if len(out) != len(pairs):
        seen = set()
        key = next(k for k, _ in pairs if k in seen or seen.add(k))
        raise _DuplicateKey(key)
    return out


class _DuplicateKey(ValueError):
    def __init__(self, key):
        super().__init__(key)
        self.key = key


_DECODER = json.JSONDecoder(object_pairs_hook=_unique_keys)


def parse_json(text: str, path, line: int = 1) -> Any:
    """The one JSON value of `text` (which starts on `line` of the file `path`)."""
    value, end = _decode(text, path, _WHITESPACE.match(text).end(), line)
    if text[end:].strip():
        extra = line + text.count("\n", 0, end)
        raise InputError(f"{path} line {extra}: invalid JSON: extra data after the value", path, extra)
    return value


def _decode(text: str, path, pos: int, first_line: int, row: bool = False) -> Tuple[Any, int]:
    """(value, end) of the JSON value at `pos`; `first_line` is the file line `text` starts on. A syntax error is
    named by the line the parser stopped on, or for a `row` of a data file by the line the row starts on."""
    def line_at(offset: int) -> int:
        return first_line + text.count("\n", 0, offset)

    try:
        value, end = _DECODER.raw_decode(text, pos)
    except _DuplicateKey as dup:
        raise InputError(f"{where(path, line_at(pos))}: key {dup.key!r} is given twice", path, line_at(pos)) from None
    except json.JSONDecodeError as err:
        stop = line_at(err.pos)
        line = line_at(pos) if row else stop
        at = f"column {err.colno}" if stop == line else f"line {stop} column {err.colno}"
        raise InputError(f"{path} line {line}: invalid JSON: {err.msg} ({at})", path, line) from None
    except RecursionError:
        raise InputError(f"{path} line {line_at(pos)}: JSON nested too deeply (more than about "
                         f"{sys.getrecursionlimit()} levels)", path, line_at(pos)) from None
    if _SURROGATE_ESCAPE.search(text, pos, end) and has_lone_surrogate(value):
        match = _lone_surrogate_escape(text, pos, end)
        line = line_at(match.start()) if match else line_at(pos)
        escape = match.group(0) if match else "\\ud8xx"
        raise InputError(f"{path} line {line}: a lone UTF-16 surrogate escape ({escape}) is not text; write the "
                         "character itself or a full surrogate pair", path, line)
    return value, end


def has_lone_surrogate(value) -> bool:
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return True
        return False
    if isinstance(value, dict):
        return any(has_lone_surrogate(k) or has_lone_surrogate(v) for k, v in value.items())
    return isinstance(value, list) and any(has_lone_surrogate(v) for v in value)


def _lone_surrogate_escape(text: str, start: int, end: int):
    for match in _SURROGATE_ESCAPE.finditer(text, start, end):
        high = match.group(0)[2].lower() == "d" and match.group(0)[3].lower() in "89ab"
        after = text[match.end(): match.end() + 6]
        before = text[max(0, match.start() - 6): match.start()]
        if (high and not re.fullmatch(r"\\u[dD][c-fC-F][0-9a-fA-F]{2}", after)) or (
                not high and not re.fullmatch(r"\\u[dD][89abAB][0-9a-fA-F]{2}", before)):
            return match
    return None


def read_json(path, what: str = "JSON file", limit: int = MAX_INPUT_BYTES) -> Any:
    """The JSON value of a file."""
    return parse_json(read_json_text(path, what, limit), os.fspath(path))


def read_json_object(path, what: str = "JSON file", limit: int = MAX_INPUT_BYTES) -> dict:
    value = read_json(path, what, limit)
    if not isinstance(value, dict):
        raise InputError(f"{path}: expected a JSON object ({what}), got {json_type_name(value)}", os.fspath(path))
    return value


def json_values(path, what: str = "data file", limit: int = MAX_INPUT_BYTES) -> List[Tuple[int, Any]]:
    """(line, value) of each top-level JSON value of a file: JSON lines (also pretty-printed rows, one after the
    other), or the elements of one JSON array."""
    path = os.fspath(path)
    text = read_json_text(path, what, limit)
    if not text.lstrip().startswith("["):
        try:
            return _one_per_line(text, path)  # the common case, and the fast one
        except InputError:
            pass  # rows over several lines, or an error the scanner names by the row it is in
    return _scan(text, path)


def _scan(text: str, path: str) -> List[Tuple[int, Any]]:
    newlines = [m.start() for m in re.finditer("\n", text)]
    line_of = lambda pos: bisect.bisect_left(newlines, pos) + 1  # noqa: E731
    pos = _WHITESPACE.match(text).end()
    is_array = text.startswith("[", pos)
    if is_array:
        pos = _WHITESPACE.match(text, pos + 1).end()
    values: List[Tuple[int, Any]] = []
    while pos < len(text) and not (is_array and text[pos] == "]"):
        line = line_of(pos)
        value, pos = _decode(text, path, pos, 1, row=True)
        values.append((line, value))
        pos = _WHITESPACE.match(text, pos).end()
        if is_array and text.startswith(",", pos):
            pos = _WHITESPACE.match(text, pos + 1).end()
        elif is_array and not text.startswith("]", pos):
            line = line_of(min(pos, len(text)))
            raise InputError(f"{path} line {line}: invalid JSON: expected ',' or ']' in the array", path, line)
    if is_array:
        end = _WHITESPACE.match(text, pos + 1).end() if pos < len(text) else pos
        if pos >= len(text):
            raise InputError(f"{path} line {line_of(pos)}: invalid JSON: the array is not closed", path, line_of(pos))
        if end < len(text):
            raise InputError(f"{path} line {line_of(end)}: invalid JSON: extra data after the array", path,
                             line_of(end))
    return values


def _one_per_line(text: str, path: str) -> List[Tuple[int, Any]]:
    return [(number, parse_json(line, path, number)) for number, line in enumerate(text.split("\n"), 1)
            if line.strip()]


def json_lines(path, what: str = "JSONL file", limit: int = MAX_INPUT_BYTES) -> List[Tuple[int, Any]]:
    """(line, value) of every non-blank line of a JSON-lines file, one JSON value per line."""
    path = os.fspath(path)
    return _one_per_line(read_json_text(path, what, limit), path)


def json_type_name(value: Any) -> str:
    return {dict: "an object", list: "an array", str: "a string", bool: "a boolean", type(None): "null"}.get(
        type(value), "a number")
