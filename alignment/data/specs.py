"""Dataset specs as argument files write them (`name`, `name:proportion`, `name:proportion:path`, lists and
dicts of those): parsed once into DatasetSpec values. Pure Python."""
from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Union

SPEC_FORMS = "'name', 'name:proportion' or 'name:proportion:path'"


@dataclass(frozen=True)
class DatasetSpec:
    """One dataset of a mixture: registry ``name``, ``proportion`` (>1 repeats,
    <1 subsamples) and an optional local ``path`` (``None``: the loader's default)."""

    name: str
    proportion: float = 1.0
    path: str | None = None

    def __post_init__(self) -> None:
        _parse_proportion(self.proportion, f"{self.name}:{self.proportion}")


SpecsLike = Union[str, DatasetSpec, Mapping[str, Any], Iterable[Union[str, DatasetSpec, Mapping[str, Any]]]]


def parse_dataset_specs(specs: SpecsLike) -> list[DatasetSpec]:
    """Parse dataset specs as written in argument files.

    Accepted: ``"name"``, ``"name:proportion"``, ``"name:proportion:path"`` (split on
    ':' at most twice, so the path may contain ':'), a comma-separated string of those,
    a list of such strings (or :class:`DatasetSpec` / ``{"name", "proportion", "path"}``
    dicts), or a dict ``{name: proportion}`` / ``{name: {"proportion": p, "path": ...}}``.
    """
    if isinstance(specs, Mapping):
        result = [_parse_mapping_entry(name, value) for name, value in specs.items()]
    elif isinstance(specs, (str, DatasetSpec)):
        result = _parse_item(specs)
    elif isinstance(specs, Iterable):
        result = [spec for item in specs for spec in _parse_item(item)]
    else:
        raise ValueError(f"Invalid dataset specs {specs!r}: expected a string, list or dict")
    if not result:
        raise ValueError(f"Invalid dataset specs {specs!r}: no dataset given")
    return result


def _parse_item(item: Any) -> list[DatasetSpec]:
    if isinstance(item, DatasetSpec):
        return [item]
    if isinstance(item, str):
        if any(not part.strip() for part in item.split(",")):
            raise ValueError(f"Invalid dataset specs {item!r}: empty entry (expected {SPEC_FORMS}, comma-separated)")
        return [_parse_spec_string(part) for part in item.split(",")]
    if isinstance(item, Mapping) and "name" in item:
        return [_parse_mapping_entry(item["name"], {key: value for key, value in item.items() if key != "name"})]
    raise ValueError(f"Invalid dataset spec {item!r}: expected a string like {SPEC_FORMS}")


def _parse_spec_string(spec: str) -> DatasetSpec:
    parts = [part.strip() for part in spec.split(":", 2)]
    name = parts[0]
    if not name:
        raise ValueError(f"Invalid dataset spec {spec!r}: empty dataset name (expected {SPEC_FORMS})")
    proportion = _parse_proportion(parts[1], spec) if len(parts) > 1 else 1.0
    path = parts[2] if len(parts) > 2 else None
    if path == "":
        raise ValueError(f"Invalid dataset spec {spec!r}: empty path (expected {SPEC_FORMS})")
    return DatasetSpec(name, proportion, path)


def _parse_mapping_entry(name: Any, value: Any) -> DatasetSpec:
    spec_text = f"{name}: {value!r}"
    if not isinstance(name, str) or not name.strip():
        raise ValueError(f"Invalid dataset spec {spec_text!r}: dataset name must be a non-empty string")
    if value is None:
        return DatasetSpec(name.strip())
    if not isinstance(value, Mapping):
        return DatasetSpec(name.strip(), _parse_proportion(value, spec_text))
    unknown = set(value) - {"proportion", "path"}
    if unknown:
        raise ValueError(f"Invalid dataset spec {spec_text!r}: unknown keys {sorted(unknown)} (use proportion, path)")
    proportion = _parse_proportion(value.get("proportion", 1.0), spec_text)
    path = value.get("path")
    if path is not None and (not isinstance(path, (str, os.PathLike)) or not str(path).strip()):
        raise ValueError(f"Invalid dataset spec {spec_text!r}: path must be a non-empty string")
    return DatasetSpec(name.strip(), proportion, None if path is None else os.fspath(path))


def _parse_proportion(value: Any, spec: str) -> float:
    if isinstance(value, bool):
        raise ValueError(f"Invalid dataset spec {spec!r}: proportion {value!r} is not a number")
    try:
        proportion = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"Invalid dataset spec {spec!r}: proportion {value!r} is not a number") from None
    if not math.isfinite(proportion) or proportion <= 0:
        raise ValueError(f"Invalid dataset spec {spec!r}: proportion must be > 0, got {value!r}")
    return proportion
