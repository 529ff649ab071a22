"""Tool-call formats: how tools are shown to the policy, how its calls are written, and how they are parsed back.

A format is a registered `ToolCallFormat` subclass (the Hermes/Qwen `<tool_call>{json}</tool_call>` convention
is "hermes", the default); another is added by subclassing with a new `NAME`. Pure Python (no paddle).
"""
from __future__ import annotations

import json
import re
from typing import Any, ClassVar, Dict, List, Sequence, Tuple

from alignment.config.registry import TOOL_CALL_FORMATS, Registered
from alignment.envs.tools import ToolCall


class ToolCallFormat(Registered, registry=TOOL_CALL_FORMATS):
    """`parse(text)` -> the calls in an assistant turn (malformed ones as ToolCall with `error` set);
    `system_prompt(schemas)` -> the text that shows the tools to the policy; `format_call` writes one call (for
    tool-use traces); `stop_strings`: a turn that ends with one of them is over (the rollout stops there)."""

    stop_strings: ClassVar[Tuple[str, ...]] = ()

    def parse(self, text: str) -> List[ToolCall]:
        raise NotImplementedError

    def system_prompt(self, schemas: Sequence[Dict[str, Any]]) -> str:
        raise NotImplementedError

    def format_call(self, name: str, arguments: Dict[str, Any]) -> str:
        raise NotImplementedError


def tool_call_format(name: str) -> ToolCallFormat:
    """An instance of the format registered as `name`."""
    return ToolCallFormat.lookup(name)()


class HermesFormat(ToolCallFormat):
    """`<tool_call>{"name": ..., "arguments": {...}}</tool_call>`, the convention of Hermes and Qwen2.5/Qwen3
    chat templates (an "arguments" JSON string holding an object is accepted too)."""

    NAME = "hermes"
    OPEN, CLOSE = "<tool_call>", "</tool_call>"
    stop_strings = (CLOSE,)
    _CALL = re.compile(r"<tool_call>(.*?)(</tool_call>|$)", re.DOTALL)

    def parse(self, text: str) -> List[ToolCall]:
        calls = []
        for match in self._CALL.finditer(text):
            if not match.group(2):
                calls.append(ToolCall("", {}, f"unterminated {self.OPEN} (no {self.CLOSE})"))
            else:
                calls.append(self._parse_body(match.group(1).strip()))
        return calls

    def _parse_body(self, body: str) -> ToolCall:
        try:
            call = json.loads(body)
        except (ValueError, RecursionError) as err:
            return ToolCall("", {}, f"tool call is not valid JSON ({err}): {body[:200]!r}")
        if not isinstance(call, dict) or not isinstance(call.get("name"), str) or not call["name"]:
            return ToolCall("", {}, f'tool call must be a JSON object with a "name" string: {body[:200]!r}')
        arguments = call.get("arguments", {})
        if isinstance(arguments, str):
            try:
                arguments = json.loads(arguments)
            except (ValueError, RecursionError):
                pass
        if not isinstance(arguments, dict):
            return ToolCall(call["name"], {}, f'tool {call["name"]!r}: "arguments" must be a JSON object')
        return ToolCall(call["name"], arguments)

    def system_prompt(self, schemas: Sequence[Dict[str, Any]]) -> str:
        listing = "\n".join(json.dumps(schema, ensure_ascii=False) for schema in schemas)
        return ("# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
                "You are provided with function signatures within <tools></tools> XML tags:\n"
                f"<tools>\n{listing}\n</tools>\n\n"
                "For each function call, return a json object with function name and arguments within "
                "<tool_call></tool_call> XML tags:\n"
                '<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>')

    def format_call(self, name: str, arguments: Dict[str, Any]) -> str:
        call = json.dumps({"name": name, "arguments": arguments}, ensure_ascii=False)
        return f"{self.OPEN}\n{call}\n{self.CLOSE}"


class CompactHermesFormat(HermesFormat):
    """Hermes calls, with each tool shown in one line (`name(arg: type, ...): description`) instead of its JSON
    schema: a third of the prompt, for small models and short contexts."""

    NAME = "hermes-compact"

    def system_prompt(self, schemas: Sequence[Dict[str, Any]]) -> str:
        lines = []
        for schema in schemas:
            function = schema["function"]
            properties = function.get("parameters", {}).get("properties", {})
            arguments = ", ".join(f"{name}: {spec.get('type', 'any')}" for name, spec in properties.items())
            lines.append(f"{function['name']}({arguments}): {function.get('description', '')}".rstrip(": "))
        return ("# Tools\n" + "\n".join(lines) + "\n"
                'Call a tool as <tool_call>{"name": <name>, "arguments": {<argument>: <value>}}</tool_call>')
