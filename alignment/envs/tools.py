"""Tools as plain Python functions: the OpenAI function-calling schema from type hints and a Google-style
docstring, and running a parsed call so that every failure (unknown tool, bad arguments, a raise, a timeout)
becomes an error text the policy reads instead of an exception. Pure Python (no paddle)."""
from __future__ import annotations

import collections.abc
import dataclasses
import inspect
import json
import re
import threading
import time
import types
import typing
from typing import Any, Callable, Dict, Mapping, NamedTuple, Optional, Union


MAX_RESULT_CHARS = 4000
DEFAULT_TIMEOUT = 10.0

_JSON_TYPES = {str: "string", int: "integer", float: "number", bool: "boolean", dict: "object", list: "array",
               tuple: "array", type(None): "null"}
_SECTION = re.compile(r"^\s*(Args|Arguments|Parameters|Returns|Yields|Raises|Examples?|Notes?)\s*:\s*$")
_ARG_LINE = re.compile(r"^(\*{0,2}\w+)\s*(?:\(([^)]*)\))?\s*:\s*(.*)$")


class ToolCall(NamedTuple):
    """A call parsed from the policy's text; `error` is set (and name/arguments may be empty) when it did not
    parse."""
    name: str
    arguments: Dict[str, Any]
    error: Optional[str] = None


class ToolResult(NamedTuple):
    content: str  # what the policy reads in the `tool` message
    error: bool  # the call failed (did not parse, unknown tool, bad arguments, raised, timed out)
    seconds: float


@dataclasses.dataclass(frozen=True)
class Tool:
    """A function the policy may call: `schema` is what the prompt shows; a call running longer than `timeout`
    seconds returns a timeout error (the function's thread is left to finish in the background, so a tool that
    can hang should bound itself, as the `python` sandbox does)."""
    name: str
    fn: Callable[..., Any]
    schema: Dict[str, Any]
    timeout: float = DEFAULT_TIMEOUT


def as_tool(fn: Union[Tool, Callable[..., Any]], timeout: Optional[float] = None) -> Tool:
    """A Tool from a function (its schema from `tool_schema`), or the Tool itself (with `timeout` if given)."""
    if isinstance(fn, Tool):
        return fn if timeout is None else dataclasses.replace(fn, timeout=timeout)
    schema = tool_schema(fn)
    return Tool(schema["function"]["name"], fn, schema, DEFAULT_TIMEOUT if timeout is None else timeout)


# --------------------------------------------------------------------------- schema


def tool_schema(fn: Callable[..., Any]) -> Dict[str, Any]:
    """The OpenAI function-calling schema of `fn`: every parameter needs a type hint; its description comes from
    the docstring's "Args:" section; parameters without a default are required."""
    name = getattr(fn, "__name__", None)
    if not name or not callable(fn):
        raise ValueError(f"tool {fn!r}: not a named function")
    try:
        hints = typing.get_type_hints(fn)
    except Exception as err:  # an unresolvable annotation
        raise ValueError(f"tool {name!r}: cannot read its type hints ({err})") from None
    description, arg_docs = parse_docstring(inspect.getdoc(fn) or "")
    properties, required = {}, []
    for param in inspect.signature(fn).parameters.values():
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            raise ValueError(f"tool {name!r}: *{param.name} parameters cannot be described to the policy")
        if param.name not in hints:
            raise ValueError(f"tool {name!r}: parameter {param.name!r} has no type hint")
        prop = json_type(hints[param.name], f"tool {name!r} parameter {param.name!r}")
        if param.name in arg_docs:
            prop["description"] = arg_docs[param.name]
        properties[param.name] = prop
        if param.default is param.empty:
            required.append(param.name)
    return {"type": "function", "function": {"name": name, "description": description,
                                             "parameters": {"type": "object", "properties": properties,
                                                            "required": required}}}


def json_type(hint: Any, where: str) -> Dict[str, Any]:
    """A JSON-schema type for a type hint: str, int, float, bool, list[X], tuple, dict, Optional[X], Literal."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint in _JSON_TYPES:
        return {"type": _JSON_TYPES[hint]}
    if origin is typing.Literal:
        kinds = {_JSON_TYPES.get(type(value)) for value in args}
        if len(kinds) != 1 or None in kinds:
            raise ValueError(f"{where}: Literal values must share one JSON type")
        return {"type": kinds.pop(), "enum": list(args)}
    if origin in (Union, types.UnionType):
        options = [arg for arg in args if arg is not type(None)]
        if len(options) == 1:  # Optional[X]: the schema of X (optional-ness comes from the default)
            return json_type(options[0], where)
        return {"anyOf": [json_type(arg, where) for arg in options]}
    if origin in (list, tuple, collections.abc.Sequence):
        schema = {"type": "array"}
        items = set(arg for arg in args if arg is not Ellipsis)
        if len(items) == 1:
            schema["items"] = json_type(items.pop(), where)
        return schema
    if origin in (dict, collections.abc.Mapping):
        return {"type": "object"}
    raise ValueError(f"{where}: type {hint!r} has no JSON-schema equivalent (use str, int, float, bool, list, "
                     f"dict, Optional or Literal)")


def parse_docstring(doc: str):
    """A Google-style docstring -> (description, {argument: description}). The description is the text before
    the first section header; an "Args:" entry is `name: text` or `name (type): text`, continued on more
    indented lines."""
    description, args, section, current, indent = [], {}, None, None, None
    for line in doc.splitlines():
        header = _SECTION.match(line)
        if header:
            section, current, indent = header.group(1), None, None
            continue
        if section is None:
            description.append(line)
            continue
        if section not in ("Args", "Arguments", "Parameters") or not line.strip():
            continue
        own = len(line) - len(line.lstrip())
        entry = _ARG_LINE.match(line.strip())
        if entry and (indent is None or own <= indent):
            indent, current = own, entry.group(1).lstrip("*")
            args[current] = entry.group(3).strip()
        elif current is not None:
            args[current] = f"{args[current]} {line.strip()}".strip()
    return " ".join(" ".join(description).split()), args


# --------------------------------------------------------------------------- running calls


def run_tool_call(call: ToolCall, tools: Mapping[str, Tool]) -> ToolResult:
    """Run one parsed call; never raises: a failure is a ToolResult with error=True and the reason as text."""
    start = time.perf_counter()

    def failed(text: str) -> ToolResult:
        return ToolResult(f"Error: {text}", True, time.perf_counter() - start)

    if call.error is not None:
        return failed(call.error)
    tool = tools.get(call.name)
    if tool is None:
        known = ", ".join(sorted(tools)) or "none"
        return failed(f"unknown tool {call.name!r} (available: {known})")
    try:
        inspect.signature(tool.fn).bind(**call.arguments)
    except TypeError as err:
        return failed(f"tool {tool.name!r}: bad arguments ({err})")
    outcome: Dict[str, Any] = {}

    def target() -> None:
        try:
            outcome["value"] = tool.fn(**call.arguments)
        except BaseException as err:  # the tool's own failure, reported to the policy
            outcome["error"] = err

    thread = threading.Thread(target=target, name=f"tool-{tool.name}", daemon=True)
    thread.start()
    thread.join(tool.timeout)
    if thread.is_alive():
        return failed(f"tool {tool.name!r} timed out after {tool.timeout:g} s")
    if "error" in outcome:
        err = outcome["error"]
        return failed(f"tool {tool.name!r} raised {type(err).__name__}: {err}")
    return ToolResult(bounded_text(result_text(outcome.get("value"))), False, time.perf_counter() - start)


def result_text(value: Any) -> str:
    if isinstance(value, str):
        return value
    try:
        return json.dumps(value, ensure_ascii=False)
    except (TypeError, ValueError):
        return str(value)


def bounded_text(text: str, limit: int = MAX_RESULT_CHARS) -> str:
    if len(text) <= limit:
        return text
    return f"{text[:limit]}... [{len(text) - limit} more characters cut]"
