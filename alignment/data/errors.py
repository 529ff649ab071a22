"""The one error type of the data layer, and how an exception raised by user code (a dataset module) becomes one
line naming the module, the row and the user's file and line."""
from __future__ import annotations

import os

from alignment.inputs import InputError

_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep


class DataFormatError(InputError):
    """A data file (or hub row) does not match the schema a loader expects.

    ``path`` and ``line`` (1-based) say where, when known; the message always
    starts with the location, e.g. ``data/x.jsonl line 7: missing key 'response_1'``.
    """


def user_code_error(what: str, err: BaseException) -> DataFormatError:
    """One line for an exception user code raised: what failed, the exception, and the file and line it came from
    (the innermost frame outside this package; a SyntaxError's own location)."""
    location, frame = "", err.__traceback__
    if isinstance(err, SyntaxError) and err.filename:
        location, frame = f" ({err.filename} line {err.lineno})", None
    while frame is not None:  # the innermost frame of user code (not this package's, not importlib's)
        file = frame.tb_frame.f_code.co_filename
        if not file.startswith((_PACKAGE_DIR, "<")):
            location = f" ({file} line {frame.tb_lineno})"
        frame = frame.tb_next
    message = " ".join(str(err.msg if isinstance(err, SyntaxError) else err).split())[:300]
    return DataFormatError(f"{what}: {type(err).__name__}: {message}{location}")

