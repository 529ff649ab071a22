"""JSON argument files into documented dataclasses, PaddleNLP `PdArgumentParser` style.

    python run_x.py args.json [--key value ...]     # the file, then overrides
    python run_x.py --key value ...                 # flags only

Every key must be a field of exactly one of the dataclasses; unknown keys, wrong types and contradicting values
(checked by each dataclass's `validate()`) raise `ArgumentError` naming the key and the file.
"""
from __future__ import annotations

import dataclasses
import difflib
import json
import typing
from typing import Any, Dict, List, Sequence, Tuple


class ArgumentError(ValueError):
    """A bad argument file or flag; the message names the file and key."""


def _type_name(tp) -> str:
    return getattr(tp, "__name__", None) or str(tp).replace("typing.", "")


def _convert(value: Any, tp, key: str) -> Any:
    """Check / convert one value against a field type; raise TypeError with a readable reason."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if tp is Any:
        return value
    if origin is typing.Union:
        if value is None and type(None) in args:
            return None
        if isinstance(value, str) and value.strip()[:1] in ("[", "{"):  # JSON given on the command line
            try:
                value = json.loads(value)
            except json.JSONDecodeError:
                pass
        for option in (a for a in args if a is not type(None)):
            try:
                return _convert(value, option, key)
            except TypeError:
                continue
        raise TypeError(f"expected {' or '.join(_type_name(a) for a in args)}, got {value!r}")
    if origin in (list, List):
        if isinstance(value, str) and value.strip().startswith("["):  # a JSON list on the command line
            try:
                value = json.loads(value)
            except json.JSONDecodeError:
                raise TypeError(f"expected a JSON list, got {value!r}") from None
        if isinstance(value, str):
            value = [v for v in value.split(",") if v]
        if not isinstance(value, list):
            raise TypeError(f"expected a list, got {value!r}")
        return [_convert(v, args[0], key) for v in value] if args else value
    if origin in (dict, Dict):
        if isinstance(value, str):
            try:
                value = json.loads(value)
            except json.JSONDecodeError:
                raise TypeError(f"expected a JSON object, got {value!r}") from None
        if not isinstance(value, dict):
            raise TypeError(f"expected an object, got {value!r}")
        return value
    if tp is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "false", "1", "0", "yes", "no"):
            return value.lower() in ("true", "1", "yes")
        raise TypeError(f"expected true or false, got {value!r}")
    if tp is int:
        if isinstance(value, bool):
            raise TypeError(f"expected an integer, got {value!r}")
        if isinstance(value, int):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
        if isinstance(value, str):
            try:
                return int(value)
            except ValueError:
                pass
        raise TypeError(f"expected an integer, got {value!r}")
    if tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, str):
            try:
                return float(value)
            except ValueError:
                pass
        raise TypeError(f"expected a number, got {value!r}")
    if tp is str:
        if isinstance(value, str):
            return value
        raise TypeError(f"expected a string, got {value!r}")
    raise TypeError(f"unsupported field type {tp}")


def parse_flags(argv: Sequence[str]) -> Dict[str, str]:
    """['--a', '1', '--b=x', '--flag'] -> {'a': '1', 'b': 'x', 'flag': 'true'}."""
    out, i = {}, 0
    while i < len(argv):
        token = argv[i]
        if not token.startswith("--"):
            raise ArgumentError(f"command line: expected --key value, got {token!r}")
        key = token[2:]
        if "=" in key:
            key, value = key.split("=", 1)
        elif i + 1 < len(argv) and not argv[i + 1].startswith("--"):
            value, i = argv[i + 1], i + 1
        else:
            value = "true"
        out[key.replace("-", "_")] = value
        i += 1
    return out


class ArgumentParser:
    def __init__(self, *dataclass_types):
        self.dataclass_types = dataclass_types
        self.owner = {}
        for cls in dataclass_types:
            for field in dataclasses.fields(cls):
                if field.name in self.owner:
                    raise ValueError(f"argument {field.name!r} is defined twice")
                self.owner[field.name] = cls

    def parse_dict(self, values: Dict[str, Any], source: str = "arguments") -> Tuple:
        unknown = [k for k in values if k not in self.owner]
        if unknown:
            key = unknown[0]
            close = difflib.get_close_matches(key, list(self.owner), n=3)
            hint = f"; did you mean {', '.join(close)}?" if close else ""
            raise ArgumentError(f"{source}: unknown key {key!r}{hint} (run with --help to list all keys)")
        results = []
        for cls in self.dataclass_types:
            hints = typing.get_type_hints(cls)
            kwargs = {}
            for field in dataclasses.fields(cls):
                if field.name not in values:
                    if field.default is dataclasses.MISSING and field.default_factory is dataclasses.MISSING:
                        raise ArgumentError(f"{source}: missing required key {field.name!r} "
                                            f"({field.metadata.get('help', '')})")
                    continue
                try:
                    kwargs[field.name] = _convert(values[field.name], hints[field.name], field.name)
                except TypeError as err:
                    raise ArgumentError(f"{source}: key {field.name!r}: {err}") from None
            instance = cls(**kwargs)
            try:
                if hasattr(instance, "validate"):
                    instance.validate()
            except ValueError as err:
                raise ArgumentError(f"{source}: {err}") from None
            results.append(instance)
        self._cross_validate(results, source)
        return tuple(results)

    def _cross_validate(self, results, source):
        for instance in results:
            if hasattr(instance, "validate_with"):
                try:
                    instance.validate_with(*results)
                except ValueError as err:
                    raise ArgumentError(f"{source}: {err}") from None

    def parse_args(self, argv: Sequence[str]) -> Tuple:
        argv = list(argv)
        if argv and argv[0] in ("-h", "--help"):
            print(self.format_help())
            raise SystemExit(0)
        values, source = {}, "command line"
        if argv and not argv[0].startswith("--"):
            path = argv.pop(0)
            values = load_json_arguments(path)
            source = path
        flags = parse_flags(argv)
        if flags:
            source = f"{source} + command line" if values else source
        values.update(flags)
        return self.parse_dict(values, source)

    def format_help(self) -> str:
        lines = []
        for cls in self.dataclass_types:
            lines.append(f"{cls.__name__}:")
            hints = typing.get_type_hints(cls)
            for field in dataclasses.fields(cls):
                default = "required" if field.default is dataclasses.MISSING and \
                    field.default_factory is dataclasses.MISSING else (
                        field.default if field.default is not dataclasses.MISSING else field.default_factory())
                lines.append(f"  --{field.name} ({_type_name(hints[field.name])}, default {default!r}): "
                             f"{field.metadata.get('help', '')}")
        return "\n".join(lines)


def load_json_arguments(path: str) -> Dict[str, Any]:
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except FileNotFoundError:
        raise ArgumentError(f"{path}: argument file not found") from None
    except json.JSONDecodeError as err:
        raise ArgumentError(f"{path}: not valid JSON: {err.msg} at line {err.lineno} column {err.colno}") from None
    except UnicodeDecodeError as err:
        raise ArgumentError(f"{path}: not UTF-8 text ({err.reason} at byte {err.start})") from None
    if not isinstance(data, dict):
        raise ArgumentError(f"{path}: the argument file must hold one JSON object of key: value pairs")
    return data


def to_dict(*instances) -> Dict[str, Any]:
    """The effective configuration as one flat dict (what `args.json` holds)."""
    out = {}
    for instance in instances:
        out.update(dataclasses.asdict(instance))
    return out


def field(default=dataclasses.MISSING, help: str = "", **kwargs):
    """`dataclasses.field` with a required help text (every argument is documented)."""
    if not help:
        raise ValueError("every argument needs a help text")
    if isinstance(default, (list, dict)):
        return dataclasses.field(default_factory=lambda: type(default)(default), metadata={"help": help}, **kwargs)
    return dataclasses.field(default=default, metadata={"help": help}, **kwargs)
