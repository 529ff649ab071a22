"""The OpenAI chat-completions protocol, as much of it as the gateway serves: a request body checked into a
`ChatRequest`, and errors shaped as OpenAI's (`{"error": {"message", "type", "param", "code"}}`). Pure Python.

`ChatRequest` is the one form of a conversation the backend samples: the Responses and Anthropic Messages routes
(responses.py, anthropic_messages.py) write their requests as a chat-completions body and check it here, so the same
conversation renders to the same prompt tokens whichever protocol carries it."""
from __future__ import annotations

import dataclasses
import json
import math
from typing import Any, Dict, List, Optional

ROLES = ("system", "user", "assistant", "tool")


class GatewayError(Exception):
    """A request the gateway refuses: HTTP status, OpenAI error type, the parameter at fault, a code."""

    def __init__(self, status: int, message: str, param: Optional[str] = None, code: Optional[str] = None,
                 kind: str = "invalid_request_error"):
        super().__init__(message)
        self.status, self.param, self.code, self.kind = status, param, code, kind

    def body(self) -> dict:
        message = " ".join(str(self).split())[:1000]
        return {"error": {"message": message, "type": self.kind, "param": self.param, "code": self.code}}


@dataclasses.dataclass(frozen=True)
class Limits:
    max_body_bytes: int = 4 << 20
    max_messages: int = 512
    max_chars: int = 1 << 20  # of all message contents together
    max_tools: int = 64
    max_n: int = 16


@dataclasses.dataclass(frozen=True)
class ToolCallMessage:
    """One call of an assistant message: its id, the function's name and its arguments (a dict)."""
    id: str
    name: str
    arguments: Dict[str, Any]


@dataclasses.dataclass(frozen=True)
class Message:
    role: str
    content: str
    tool_calls: tuple = ()  # ToolCallMessage, assistant messages only
    tool_call_id: Optional[str] = None


@dataclasses.dataclass(frozen=True)
class ChatRequest:
    messages: tuple  # Message
    tools: tuple  # the request's tool schemas ({"type": "function", "function": {...}}), JSON-ready
    max_tokens: Optional[int] = None
    temperature: Optional[float] = None
    top_p: Optional[float] = None
    n: int = 1
    stop: tuple = ()
    seed: Optional[int] = None
    logprobs: bool = False
    top_logprobs: int = 0  # the k most likely tokens at each sampled position (with logprobs)
    model: str = ""
    stream: bool = False  # answered as server-sent events (streaming.py)
    stream_usage: bool = False  # chat's stream_options.include_usage: a last chunk with the usage


def _invalid(message: str, param: str) -> GatewayError:
    return GatewayError(400, message, param)


def number(body: dict, key: str, low: float, high: float, integer: bool = False):
    """body[key] checked to be a number (an int when `integer`) in [low, high], or None when absent."""
    value = body.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (integer and not isinstance(value, int)):
        raise _invalid(f"'{key}' must be {'an integer' if integer else 'a number'}, got {value!r}", key)
    if not (isinstance(value, int) or math.isfinite(value)) or not low <= value <= high:
        raise _invalid(f"'{key}' must be in [{low:g}, {high:g}], got {value!r}", key)
    return value


def _content(value: Any, where: str) -> str:
    """A message content: a string, a list of {"type": "text", "text"} parts, or null (an assistant's with calls)."""
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, list) and all(isinstance(p, dict) and p.get("type") == "text" and
                                       isinstance(p.get("text"), str) for p in value):
        return "".join(p["text"] for p in value)
    raise _invalid(f"{where}.content must be a string or a list of text parts (other content types are not "
                   f"served)", f"{where}.content")


def _tool_calls(value: Any, where: str) -> tuple:
    if value is None:
        return ()
    if not isinstance(value, list):
        raise _invalid(f"{where}.tool_calls must be a list", f"{where}.tool_calls")
    calls = []
    for j, call in enumerate(value):
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            raise _invalid(f"{where}.tool_calls[{j}] must be {{'id', 'type': 'function', 'function': {{'name', "
                           f"'arguments'}}}}", f"{where}.tool_calls")
        arguments = function.get("arguments", "{}")
        try:
            arguments = json.loads(arguments) if isinstance(arguments, str) else arguments
        except (ValueError, RecursionError):
            raise _invalid(f"{where}.tool_calls[{j}].function.arguments is not JSON", f"{where}.tool_calls") from None
        if not isinstance(arguments, dict):
            raise _invalid(f"{where}.tool_calls[{j}].function.arguments must be a JSON object", f"{where}.tool_calls")
        calls.append(ToolCallMessage(str(call.get("id", "")), function["name"], arguments))
    return tuple(calls)


def entries(body: Any, key: str, limits: Limits) -> list:
    """body[key], checked to be a non-empty list of at most limits.max_messages entries (413 above)."""
    if not isinstance(body, dict):
        raise _invalid("the body must be a JSON object", None)
    listed = body.get(key)
    if not isinstance(listed, list) or not listed:
        raise _invalid(f"'{key}' must be a non-empty list", key)
    if len(listed) > limits.max_messages:
        raise GatewayError(413, f"'{key}' has {len(listed)} entries; the limit is {limits.max_messages}", key)
    return listed


def parse_chat_request(body: Any, limits: Limits = Limits()) -> ChatRequest:
    """The body of POST /v1/chat/completions, checked; a GatewayError (400, naming the parameter) otherwise."""
    messages = entries(body, "messages", limits)
    parsed = []
    for i, m in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(m, dict) or m.get("role") not in ROLES:
            raise _invalid(f"{where} must be an object with a role in {ROLES}", f"{where}.role")
        parsed.append(Message(m["role"], _content(m.get("content"), where),
                              _tool_calls(m.get("tool_calls"), where) if m["role"] == "assistant" else (),
                              m.get("tool_call_id") if m["role"] == "tool" else None))
    if sum(len(m.content) for m in parsed) > limits.max_chars:
        raise GatewayError(413, f"the messages hold more than {limits.max_chars} characters", "messages")
    tools = body.get("tools") or []
    if not isinstance(tools, list) or len(tools) > limits.max_tools or not all(
            isinstance(t, dict) and t.get("type", "function") == "function" and isinstance(t.get("function"), dict)
            and isinstance(t["function"].get("name"), str) for t in tools):
        raise _invalid(f"'tools' must be a list of at most {limits.max_tools} {{'type': 'function', 'function': "
                       f"{{'name', ...}}}} objects", "tools")
    stop = body.get("stop") or []
    stop = [stop] if isinstance(stop, str) else stop
    if not isinstance(stop, list) or len(stop) > 4 or not all(isinstance(s, str) and s for s in stop):
        raise _invalid("'stop' must be a string or a list of at most 4 non-empty strings", "stop")
    max_tokens = number(body, "max_completion_tokens", 1, 1 << 20, True)
    max_tokens = max_tokens if max_tokens is not None else number(body, "max_tokens", 1, 1 << 20, True)
    n = number(body, "n", 1, limits.max_n, True) or 1
    stream, options = flag(body, "stream"), body.get("stream_options") or {}
    if not isinstance(options, dict) or not isinstance(options.get("include_usage", False), bool):
        raise _invalid("'stream_options' must be {'include_usage': true or false}", "stream_options")
    seed = number(body, "seed", -(1 << 63), (1 << 63) - 1, True)
    top = number(body, "top_logprobs", 0, 20, True) or 0
    if top and not body.get("logprobs"):
        raise _invalid("'top_logprobs' needs 'logprobs': true", "top_logprobs")
    return ChatRequest(tuple(parsed), tuple({"type": "function", "function": t["function"]} for t in tools),
                       max_tokens, number(body, "temperature", 0.0, 2.0), number(body, "top_p", 0.0, 1.0), n,
                       tuple(stop), seed, bool(body.get("logprobs")), top, str(body.get("model", "")), stream,
                       stream and options.get("include_usage", False))


def flag(body: dict, key: str) -> bool:
    """body[key] checked to be true, false or absent (false)."""
    value = body.get(key, False)
    if value is not None and not isinstance(value, bool):
        raise _invalid(f"'{key}' must be true or false, got {value!r}", key)
    return bool(value)
