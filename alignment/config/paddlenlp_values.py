"""Reading PaddleNLP's values: booleans written true/1/"True", numbers as strings, -1 / "" / null for "not set".
Plain Python (alignment.config is the bottom layer); used by the key table and by the translation."""
from __future__ import annotations

from typing import Optional

from alignment.launcher import world_size

_TRUE, _FALSE = ("true", "1", "yes"), ("false", "0", "no")


def as_flag(value) -> Optional[bool]:
    if isinstance(value, bool):
        return value
    if type(value) is int and value in (0, 1):
        return bool(value)
    if isinstance(value, str) and value.strip().lower() in _TRUE + _FALSE:
        return value.strip().lower() in _TRUE
    return None


def as_number(value) -> Optional[float]:
    if isinstance(value, bool):
        return None
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def asks_nothing(value, values=None) -> bool:
    """false / 0 / -1 / "" / null / []: the value switches nothing on."""
    if value is None or value == [] or value == {}:
        return True
    if isinstance(value, str) and not value.strip():
        return True
    if as_flag(value) is False:
        return True
    return as_number(value) in (0.0, -1.0)


def one_of(*allowed):
    """Inert when the value is one of `allowed` (or asks for nothing)."""
    return lambda value, values: asks_nothing(value) or same_value(value, allowed)


def same_value(value, allowed) -> bool:
    for option in allowed if isinstance(allowed, tuple) else (allowed,):
        if value == option or (as_number(value) is not None and as_number(value) == as_number(option)):
            return True
        if isinstance(value, str) and isinstance(option, str) and value.strip().lower() == option.lower():
            return True
        if as_flag(value) is not None and isinstance(option, bool) and as_flag(value) == option:
            return True
    return False


def get_set(values: dict, key: str, default):
    value = values.get(key, default)
    return default if value is None or (isinstance(value, str) and not value.strip()) else value


def get_int(values: dict, key: str, default: int) -> int:
    number = as_number(get_set(values, key, default))
    return int(number) if number is not None and number.is_integer() else default


def get_degree(values: dict, key: str) -> int:
    return max(get_int(values, key, 1), 1)  # PaddleNLP writes -1 for "not used"


def data_world_size(values: dict) -> int:
    """Processes that see different data (PaddleNLP's dataset_world_size: data x sharding ranks)."""
    model_ranks = get_degree(values, "tensor_parallel_degree") * get_degree(values, "pipeline_parallel_degree")
    return max(world_size() // model_ranks, 1)


def one_epoch(values: dict) -> bool:
    """The run is at most one pass over the data, so 'once per epoch' = once, at the end."""
    return get_int(values, "max_steps", -1) <= 0 and (as_number(get_set(values, "num_train_epochs", 1.0)) or 1.0) <= 1
