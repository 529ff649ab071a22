"""Typed keys: what the value of a key in a user's file must be (`Kind`), checked without coercing anything: a
boolean is not a number, NaN and infinity are not sizes, an integer fits int64."""
from __future__ import annotations

import json
import math
import os
from typing import Any, Callable, Dict, Iterable, List, NamedTuple, Optional, Sequence

from alignment.inputs.files import InputError, json_type_name, where

INT64_MIN, INT64_MAX = -2 ** 63, 2 ** 63 - 1



class Kind(NamedTuple):
    """What a key's value must be: `description` completes "must be ..."; `accepts(value)` says whether it is."""
    description: str
    accepts: Callable[[Any], bool]


def _is_int(value) -> bool:
    return type(value) is int and INT64_MIN <= value <= INT64_MAX


def integer(low: Optional[int] = None, high: int = INT64_MAX, description: Optional[str] = None) -> Kind:
    """An int (not a bool, not a float) in [low, high], within int64."""
    text = description or ("an integer" + (f" >= {low}" if low is not None else "")
                           + (f" <= {high}" if high != INT64_MAX else ""))
    return Kind(text, lambda v: _is_int(v) and (low is None or v >= low) and v <= high)


def number(above: Optional[float] = None, at_least: Optional[float] = None, at_most: Optional[float] = None,
           description: Optional[str] = None) -> Kind:
    """A finite int or float (not a bool) with the bounds given."""
    text = description or ("a finite number" + (f" > {above:g}" if above is not None else "")
                           + (f" >= {at_least:g}" if at_least is not None else "")
                           + (f" <= {at_most:g}" if at_most is not None else ""))

    def accepts(v) -> bool:
        return (isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
                and (above is None or v > above) and (at_least is None or v >= at_least)
                and (at_most is None or v <= at_most))
    return Kind(text, accepts)


def list_of(kind: Kind, non_empty: bool = False, description: Optional[str] = None) -> Kind:
    return Kind(description or f"a {'non-empty ' if non_empty else ''}list of {_plural(kind.description)}",
                lambda v: isinstance(v, list) and (v or not non_empty) and all(kind.accepts(x) for x in v))


def either(*kinds: Kind) -> Kind:
    return Kind(" or ".join(k.description for k in kinds), lambda v: any(k.accepts(v) for k in kinds))


def _plural(description: str) -> str:
    for article in ("an ", "a "):
        if description.startswith(article):
            return description[len(article):].replace("integer", "integers", 1).replace("number", "numbers", 1) \
                .replace("string", "strings", 1)
    return description


FLAG = Kind("true or false", lambda v: isinstance(v, bool))
TEXT = Kind("a string", lambda v: isinstance(v, str))
POSITIVE_INT = integer(1, description="a positive integer")
POSITIVE_NUMBER = number(above=0, description="a positive number")
FINITE = number()
NUMBER = Kind("a number", lambda v: isinstance(v, (int, float)) and not isinstance(v, bool))  # NaN and inf too


def short(value: Any) -> str:
    """A value as the user wrote it, cut to 40 characters."""
    text = repr(value) if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=str)
    return text if len(text) <= 40 else text[:37] + "..."


def key_problems(data: Dict[str, Any], kinds: Dict[str, Kind], required: Iterable[str] = (),
                 names: Optional[Dict[str, str]] = None) -> List[str]:
    """What is wrong with `data`'s keys: each of `required` missing, each key of `kinds` given (not null) with a
    value its kind does not accept. `names` spells a key as the file does (a GGUF file's llama.block_count)."""
    names = names or {}
    problems = [f"missing key {names.get(key, key)!r}" if key not in data else f"key {names.get(key, key)!r} is null"
                for key in required if data.get(key) is None]
    for key, kind in kinds.items():
        value = data.get(key)
        if value is not None and not kind.accepts(value):
            problems.append(f"key {names.get(key, key)!r} must be {kind.description}, got {short(value)}")
    return problems


def check_keys(data: Any, kinds: Dict[str, Kind], path, required: Sequence[str] = (), what: str = "file",
               line: Optional[int] = None) -> dict:
    """`data` itself if it is an object whose keys pass `key_problems`; else one InputError naming them all."""
    if not isinstance(data, dict):
        raise InputError(f"{where(path, line)}: expected a JSON object ({what}), got {json_type_name(data)}",
                         os.fspath(path), line)
    problems = key_problems(data, kinds, required)
    if problems:
        raise InputError(f"{where(path, line)}: " + "; ".join(problems), os.fspath(path), line)
    return data
