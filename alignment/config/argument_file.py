"""Argument files: one JSON or YAML (.yaml / .yml) object of key: value pairs, read as plain data (YAML's safe
loader, no aliases), at most MAX_ARGUMENT_FILE_BYTES, every key given once and a string."""
from __future__ import annotations

from typing import Any, Dict

from alignment.inputs import InputError, has_lone_surrogate, parse_json, read_text


class ArgumentError(ValueError):
    """A bad argument file or flag; the message names the file and key."""


MAX_ARGUMENT_FILE_BYTES = 1 << 20  # PaddleNLP's longest argument files are a few kB


def load_argument_file(path: str) -> Dict[str, Any]:
    """One JSON or YAML (.yaml / .yml) object of key: value pairs, at most MAX_ARGUMENT_FILE_BYTES, no YAML aliases;
    the file read by the shared reader (alignment/inputs: a regular UTF-8 text file, JSON errors by line)."""
    is_yaml = path.endswith((".yaml", ".yml"))
    try:
        text = read_text(path, "argument file", MAX_ARGUMENT_FILE_BYTES)
        data = _load_yaml(text) if is_yaml else parse_json(text, path)
    except FileNotFoundError:
        raise ArgumentError(f"{path}: argument file not found") from None
    except ArgumentError as err:
        raise ArgumentError(f"{path}: {err}") from None
    except InputError as err:  # it names the file (and line) already
        raise ArgumentError(str(err)) from None
    except RecursionError:
        raise ArgumentError(f"{path}: nested too deeply") from None
    if not isinstance(data, dict):
        raise ArgumentError(f"{path}: the argument file must hold one {'YAML mapping' if is_yaml else 'JSON object'} "
                            f"of key: value pairs")
    for key, value in data.items():
        if not isinstance(key, str):
            raise ArgumentError(f"{path}: key {key!r} is not a string (quote it)")
        if has_lone_surrogate(value):  # YAML's "\ud800" (JSON's are refused by the reader, with the line)
            raise ArgumentError(f"{path}: key {key!r} holds a lone UTF-16 surrogate escape, which is not text")
    return data


def _load_yaml(text: str):
    import yaml

    class UniqueKeyLoader(yaml.SafeLoader):  # safe: plain data only, never Python objects
        def compose_node(self, parent, index):
            if self.check_event(yaml.AliasEvent):  # a few lines of aliases can expand to billions of values
                event = self.peek_event()
                raise ArgumentError(f"line {event.start_mark.line + 1}: YAML aliases (*{event.anchor}) are not "
                                    "accepted in argument files; write the value out")
            return super().compose_node(parent, index)

        def construct_mapping(self, node, deep=False):
            keys = [self.construct_object(key_node, deep=deep) for key_node, _ in node.value]
            for key in keys:
                if keys.count(key) > 1:
                    raise ArgumentError(f"key {key!r} is given twice (line {node.start_mark.line + 1})")
            return super().construct_mapping(node, deep=deep)

    try:
        return yaml.load(text, Loader=UniqueKeyLoader)
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" at line {mark.line + 1} column {mark.column + 1}" if mark else ""
        raise ArgumentError(f"not valid YAML{where}: {getattr(err, 'problem', None) or err}") from None
