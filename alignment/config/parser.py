"""JSON or YAML argument files into documented dataclasses, PaddleNLP `PdArgumentParser` style.

    python run_x.py args.json [--key value ...]     # the file (.json, .yaml / .yml), then overrides
    python run_x.py --key value ...                 # flags only

Every key must be a field of exactly one of the dataclasses, or one of PaddleNLP's keys (alignment/config/paddlenlp.py:
honoured under our name, accepted with a one-line notice, or refused). Unknown and duplicate keys, wrong types,
non-finite numbers, values outside a field's range (`field(..., ge=0, lt=1)`) and contradicting values (checked by
each dataclass's `validate()`) raise one `ArgumentError` that names the file and lists every bad key.
"""
from __future__ import annotations

import dataclasses
import difflib
import json
import math
import textwrap
import typing
from typing import Any, Dict, List, Sequence, Tuple

from alignment.config import paddlenlp
from alignment.config.argument_file import ArgumentError, load_argument_file  # noqa: F401  (the parser's API)
from alignment.inputs import INT64_MAX, INT64_MIN
from alignment.launcher import speaks_for_all


def _type_name(tp) -> str:
    return getattr(tp, "__name__", None) or str(tp).replace("typing.", "")


def _convert(value: Any, tp, key: str) -> Any:
    """Check / convert one value against a field type; raise TypeError with a readable reason."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if tp is Any:
        return value
    if origin is typing.Union:
        if type(None) in args and (value is None or (isinstance(value, str) and not value.strip())):
            return None  # PaddleNLP files write an unset value as ""
        if isinstance(value, str) and value.strip()[:1] in ("[", "{"):  # JSON given on the command line
            try:
                value = json.loads(value)
            except (json.JSONDecodeError, RecursionError):
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
            except (json.JSONDecodeError, RecursionError):
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
            except (json.JSONDecodeError, RecursionError):
                raise TypeError(f"expected a JSON object, got {value!r}") from None
        if not isinstance(value, dict):
            raise TypeError(f"expected an object, got {value!r}")
        return value
    if tp is bool:
        if isinstance(value, bool):
            return value
        if type(value) is int and value in (0, 1):  # PaddleNLP files write flags as 1 / 0
            return bool(value)
        if isinstance(value, str) and value.lower() in ("true", "false", "1", "0", "yes", "no"):
            return value.lower() in ("true", "1", "yes")
        raise TypeError(f"expected true or false, got {value!r}")
    if tp is int:
        number = None
        if isinstance(value, int) and not isinstance(value, bool):
            number = value
        elif isinstance(value, float) and value.is_integer():
            number = int(value)
        elif isinstance(value, str):
            try:
                number = int(value)
            except ValueError:
                pass
        if number is None:
            raise TypeError(f"expected an integer, got {value!r}")
        if not INT64_MIN <= number <= INT64_MAX:
            raise TypeError(f"expected an integer that fits 64 bits (|n| < 2^63), got {value!r}")
        return number
    if tp is float:
        number = None
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            number = float(value)
        elif isinstance(value, str):
            try:
                number = float(value)
            except ValueError:
                pass
        if number is None:
            raise TypeError(f"expected a number, got {value!r}")
        if not math.isfinite(number):
            raise TypeError(f"expected a finite number, got {value!r}")
        return number
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
        self.notices: List[str] = []  # the PaddleNLP notices of the last parse (printed on rank 0)
        self.source = "arguments"  # where the values of the last parse_args came from: a file, flags or both
        self.owner = {}
        for cls in dataclass_types:
            for field in dataclasses.fields(cls):
                if field.name in self.owner:
                    raise ValueError(f"argument {field.name!r} is defined twice")
                self.owner[field.name] = cls

    def parse_dict(self, values: Dict[str, Any], source: str = "arguments") -> Tuple:
        values, self.notices, problems, origin = paddlenlp.translate(values, self.owner)
        for key in (k for k in values if k not in self.owner):
            close = difflib.get_close_matches(key, list(self.owner) + list(paddlenlp.TABLE), n=3)
            hint = f"; did you mean {', '.join(close)}?" if close else ""
            problems.append(f"unknown key {key!r}{hint} (run with --help to list all keys)")
        results = []
        for cls in self.dataclass_types:
            hints = typing.get_type_hints(cls)
            kwargs, bad = {}, len(problems)
            for field in dataclasses.fields(cls):
                if field.name not in values:
                    if field.default is dataclasses.MISSING and field.default_factory is dataclasses.MISSING:
                        problems.append(f"missing required key {field.name!r} ({field.metadata.get('help', '')})")
                    continue
                try:
                    kwargs[field.name] = _convert(values[field.name], hints[field.name], field.name)
                    problems += _out_of_range(field, kwargs[field.name])
                except TypeError as err:
                    problems.append(f"key {field.name!r}: {err}")
            if len(problems) > bad:
                continue  # validate() assumes well-typed values
            instance = cls(**kwargs)
            try:
                if hasattr(instance, "validate"):
                    instance.validate()
            except ValueError as err:
                problems.append(str(err))
            results.append(instance)
        if not problems:
            for instance in results:
                try:
                    if hasattr(instance, "validate_with"):
                        instance.validate_with(*results)
                except ValueError as err:
                    problems.append(str(err))
        problems = [_named_origin(problem, origin) for problem in problems]
        if len(problems) == 1:
            raise ArgumentError(f"{source}: {problems[0]}")
        if problems:
            raise ArgumentError(f"{source}: {len(problems)} problems: " + "; ".join(problems))
        if speaks_for_all():
            for line in self.notices:
                print(line)
        return tuple(results)

    def parse_args(self, argv: Sequence[str], prog: str = "python run.py") -> Tuple:
        argv = list(argv)
        if "-h" in argv or "--help" in argv:
            print(self.format_help(prog))
            raise SystemExit(0)
        values, source = {}, "command line"
        if argv and not argv[0].startswith("--"):
            path = argv.pop(0)
            values = load_argument_file(path)
            source = path
        flags = parse_flags(argv)
        if flags:
            source = f"{source} + command line" if values else source
        for key in flags:  # a flag replaces the file's value, also when the file spells the key PaddleNLP's way
            for same in paddlenlp.same_setting(key) - {key}:
                values.pop(same, None)
        values.update(flags)
        self.source = source
        return self.parse_dict(values, source)

    def format_help(self, prog: str = "python run.py") -> str:
        """Usage line, then every key by argument class and section (a class's HELP_SECTIONS): type, default, wrapped help (100 columns)."""
        lines = [f"usage: {prog} ARGS.{{json,yaml}} [--key value ...]", ""]
        lines += textwrap.wrap("Keys come from the argument file, then from --key value flags (flags win; --key-name "
                               "and --key_name are the same flag). PaddleNLP's key names are read too "
                               "(alignment/config/paddlenlp.py; docs/paddlenlp.md).", width=100)
        for cls in self.dataclass_types:
            lines += ["", f"{cls.__name__}: {(cls.__doc__ or '').strip().splitlines()[0]}"]
            hints = typing.get_type_hints(cls)
            sections = getattr(cls, "HELP_SECTIONS", {})  # {first key of a section: its heading}
            for field in dataclasses.fields(cls):
                if field.name in sections:
                    lines += ["", f"  {sections[field.name]}:"]
                if field.default is dataclasses.MISSING and field.default_factory is dataclasses.MISSING:
                    default = "required"
                else:
                    value = field.default if field.default is not dataclasses.MISSING else field.default_factory()
                    default = f"default: {json.dumps(value)}"
                lines += textwrap.wrap(f"--{field.name} {_readable_type(hints[field.name])} ({default})", width=100,
                                       initial_indent="  ", subsequent_indent=" " * 8)
                lines += textwrap.wrap(field.metadata.get("help", ""), width=100, initial_indent=" " * 6,
                                       subsequent_indent=" " * 6)
        return "\n".join(lines)


def _named_origin(problem: str, origin: Dict[str, str]) -> str:
    """A problem with one of our keys that a PaddleNLP key set also names that key."""
    for ours, theirs in origin.items():
        if f"'{ours}'" in problem and f"'{theirs}'" not in problem:
            problem += f" (set by {theirs!r})"
    return problem


def _readable_type(tp) -> str:
    """Optional[str] -> 'str or null', Union[str, List[str], dict] -> 'str | list[str] | dict'."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is typing.Union:
        names = [_readable_type(a) for a in args if a is not type(None)]
        return " | ".join(names) + (" or null" if type(None) in args else "")
    if origin in (list, List):
        return f"list[{_readable_type(args[0])}]" if args else "list"
    if origin in (dict, Dict):
        return "dict"
    return getattr(tp, "__name__", str(tp)).replace("NoneType", "null")


def to_dict(*instances) -> Dict[str, Any]:
    """The effective configuration as one flat dict (what `args.json` holds)."""
    out = {}
    for instance in instances:
        out.update(dataclasses.asdict(instance))
    return out


def field(default=dataclasses.MISSING, help: str = "", ge=None, gt=None, le=None, lt=None, **kwargs):
    """`dataclasses.field` with a required help text (every argument is documented) and an optional range of
    allowed numbers (ge: >=, gt: >, le: <=, lt: <), checked by the parser with the key named."""
    if not help:
        raise ValueError("every argument needs a help text")
    metadata = {"help": help, "range": {k: v for k, v in (("ge", ge), ("gt", gt), ("le", le), ("lt", lt))
                                        if v is not None}}
    if isinstance(default, (list, dict)):
        return dataclasses.field(default_factory=lambda: type(default)(default), metadata=metadata, **kwargs)
    return dataclasses.field(default=default, metadata=metadata, **kwargs)


_RANGE_TESTS = {"ge": (lambda x, b: x >= b, ">="), "gt": (lambda x, b: x > b, ">"),
                "le": (lambda x, b: x <= b, "<="), "lt": (lambda x, b: x < b, "<")}


def _out_of_range(field, value) -> List[str]:
    """The range problems of one converted value (numbers only; None means unset)."""
    if value is None or isinstance(value, bool) or not isinstance(value, (int, float)):
        return []
    for kind, bound in field.metadata.get("range", {}).items():
        test, sign = _RANGE_TESTS[kind]
        if not test(value, bound):
            return [f"key {field.name!r} must be {sign} {bound}, got {value}"]
    return []
