"""Anthropic Messages (`POST /v1/messages`) with tool_use / tool_result content blocks, streamed or not, as the
`anthropic` client speaks it (its base URL is the gateway's without `/v1`; the key goes as `x-api-key`).

The request becomes the chat-completions request of the same conversation: `system` a system message; an
assistant message's text blocks its content and its `tool_use` blocks its calls; a user message's `tool_result`
blocks `tool` messages and its text blocks a user message, in their order; a tool `{"name", "description",
"input_schema"}` the chat tool `{"type": "function", "function": {"name", "description", "parameters"}}`, its keys
in their order. The outcome becomes content blocks (the text, then a `tool_use` per call) and a `stop_reason`:
"tool_use", "end_turn", "stop_sequence" (with the stop sequence), or "max_tokens" for a turn cut at `max_tokens`
or at the episode's token budget (as chat completions answer it). Errors are Anthropic's
(`{"type": "error", "error": {"type", "message"}}`), with the gateway's `code` when it has one
(`context_length_exceeded`: the episode's token budget is spent)."""
from __future__ import annotations

import json
from typing import Iterator, List

from alignment.gateway import streaming
from alignment.gateway.outcome import Outcome, check_finishes
from alignment.gateway.protocol import ChatRequest, GatewayError, Limits, entries, flag, number
from alignment.gateway.route import Route

FINISH = check_finishes({"eos": "end_turn", "stop": "stop_sequence", "length": "max_tokens",
                         "budget": "max_tokens"}, "anthropic messages")
ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
               404: "not_found_error", 413: "request_too_large", 429: "rate_limit_error"}


def _invalid(message: str, param: str) -> GatewayError:
    return GatewayError(400, message, param)


def _blocks(value, where: str) -> List[dict]:
    if isinstance(value, str):
        return [{"type": "text", "text": value}]
    if isinstance(value, list) and all(isinstance(b, dict) for b in value):
        return value
    raise _invalid(f"{where} must be a string or a list of content blocks", where)


def _text(value, where: str) -> str:
    blocks = _blocks(value, where)
    if not all(b.get("type") == "text" and isinstance(b.get("text"), str) for b in blocks):
        raise _invalid(f"{where} must be a string or a list of text blocks (other block types are not served)", where)
    return "".join(b["text"] for b in blocks)


def _assistant(blocks: List[dict], where: str) -> List[dict]:
    texts, calls = [], []
    for j, block in enumerate(blocks):
        if block.get("type") == "text" and isinstance(block.get("text"), str):
            texts.append(block["text"])
        elif block.get("type") == "tool_use" and isinstance(block.get("name"), str) and isinstance(
                block.get("input", {}), dict):
            calls.append({"id": str(block.get("id", "")), "type": "function",
                          "function": {"name": block["name"], "arguments": block.get("input", {})}})
        else:
            raise _invalid(f"{where}[{j}] must be a text block or a tool_use block {{'id', 'name', 'input': an "
                           f"object}} (other block types are not served)", f"{where}[{j}]")
    return [{"role": "assistant", "content": "".join(texts), **({"tool_calls": calls} if calls else {})}]


def _user(blocks: List[dict], where: str) -> List[dict]:
    out: List[dict] = []
    for j, block in enumerate(blocks):
        if block.get("type") == "tool_result":
            out.append({"role": "tool", "tool_call_id": str(block.get("tool_use_id", "")),
                        "content": _text(block.get("content", ""), f"{where}[{j}].content")})
        elif block.get("type") == "text" and isinstance(block.get("text"), str):
            if out and out[-1]["role"] == "user":
                out[-1]["content"] += block["text"]
            else:
                out.append({"role": "user", "content": block["text"]})
        else:
            raise _invalid(f"{where}[{j}] must be a text block or a tool_result block (other block types are not "
                           f"served)", f"{where}[{j}]")
    return out


ROLES = {"user": _user, "assistant": _assistant}


def _tool(tool, i: int) -> dict:
    if not isinstance(tool, dict) or tool.get("type", "custom") != "custom" or not isinstance(tool.get("name"), str) \
            or not isinstance(tool.get("input_schema"), dict):
        raise _invalid(f"tools[{i}] must be {{'name', 'description', 'input_schema'}} (server tools are not served)",
                       f"tools[{i}]")
    renamed = {"input_schema": "parameters"}
    return {"type": "function", "function": {renamed.get(k, k): v for k, v in tool.items()
                                             if k in ("name", "description", "input_schema")}}


def chat_body(body, limits: Limits) -> dict:
    """The chat-completions body of a Messages request; a GatewayError naming the Messages parameter."""
    messages = entries(body, "messages", limits)
    max_tokens = number(body, "max_tokens", 1, 1 << 20, True)
    if max_tokens is None:
        raise _invalid("'max_tokens' is required", "max_tokens")
    chat = [{"role": "system", "content": _text(body["system"], "system")}] if body.get("system") else []
    for i, m in enumerate(messages):
        where = f"messages[{i}]"
        role = ROLES.get(m.get("role")) if isinstance(m, dict) else None
        if role is None:
            raise _invalid(f"{where} must be an object with a role in {tuple(ROLES)}", f"{where}.role")
        chat.extend(role(_blocks(m.get("content"), f"{where}.content"), f"{where}.content"))
    tools = body.get("tools") or []
    if not isinstance(tools, list):
        raise _invalid("'tools' must be a list", "tools")
    stops = body.get("stop_sequences") or []
    if not isinstance(stops, list) or len(stops) > 4 or not all(isinstance(s, str) and s for s in stops):
        raise _invalid("'stop_sequences' must be a list of at most 4 non-empty strings", "stop_sequences")
    return {"messages": chat, "tools": [_tool(t, i) for i, t in enumerate(tools)], "max_tokens": max_tokens,
            "stop": stops, "temperature": body.get("temperature"), "top_p": body.get("top_p"),
            "stream": flag(body, "stream"), "model": body.get("model", "")}


def stop_of(outcome: Outcome, request: ChatRequest) -> tuple:
    """(stop_reason, stop_sequence): a stop string of the format's (a tool call's end) that left no call is an end
    of turn."""
    choice = outcome.first
    if choice.message.tool_calls:
        return "tool_use", None
    reason = FINISH[choice.ending]
    if reason == FINISH["stop"]:
        found = sorted((choice.text.index(s), s) for s in request.stop if s in choice.text)
        return (reason, found[0][1]) if found else (FINISH["eos"], None)
    return reason, None


def content_blocks(outcome: Outcome) -> List[dict]:
    message = outcome.first.message
    return ([{"type": "text", "text": message.content}] if message.content else []) + [
        {"type": "tool_use", "id": c.id, "name": c.name, "input": c.arguments} for c in message.tool_calls]


def message_object(outcome: Outcome, request: ChatRequest, done: bool = True) -> dict:
    """The reply; `done` false: as a stream starts (no content, no stop reason yet)."""
    reason, sequence = stop_of(outcome, request) if done else (None, None)
    return {"id": f"msg_{outcome.id}", "type": "message", "role": "assistant", "model": outcome.model,
            "content": content_blocks(outcome) if done else [], "stop_reason": reason, "stop_sequence": sequence,
            "usage": {"input_tokens": outcome.prompt_tokens, "output_tokens": outcome.completion_tokens if done else 0}}


class MessagesWriter(streaming.TypedWriter):
    """message_start; the text block as it is decoded (its start, a delta per Delta, the rest, its stop), then
    each tool_use block whole (its start, one input_json_delta, its stop); message_delta (the stop reason, the
    output tokens); message_stop."""

    def start(self, head: Outcome) -> Iterator[str]:
        self.blocks = 0  # content blocks opened
        yield self.send({"type": "message_start", "message": message_object(head, self.request, done=False)})

    def text(self, text: str) -> Iterator[str]:
        if not self.blocks:
            self.blocks = 1
            yield self.send({"type": "content_block_start", "index": 0, "content_block": {"type": "text",
                                                                                          "text": ""}})
        if text:
            yield self.send({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta",
                                                                                  "text": text}})

    def delta(self, delta: streaming.Delta) -> Iterator[str]:
        return self.text(delta.text)

    def finish(self, outcome: Outcome) -> Iterator[str]:
        rest, _ = self.rest(0, outcome.first)
        if outcome.first.message.content:
            yield from self.text(rest)
            yield self.send({"type": "content_block_stop", "index": 0})
        for index, block in enumerate(content_blocks(outcome)[self.blocks:], self.blocks):
            yield self.send({"type": "content_block_start", "index": index, "content_block": {**block, "input": {}}})
            yield self.send({"type": "content_block_delta", "index": index, "delta": {
                "type": "input_json_delta", "partial_json": json.dumps(block["input"], ensure_ascii=False)}})
            yield self.send({"type": "content_block_stop", "index": index})
        reason, sequence = stop_of(outcome, self.request)
        yield self.send({"type": "message_delta", "delta": {"stop_reason": reason, "stop_sequence": sequence},
                         "usage": {"output_tokens": outcome.completion_tokens}})
        yield self.send({"type": "message_stop"})


class AnthropicMessages(Route):
    PATH = "messages"
    NAME = "anthropic messages"

    translate = staticmethod(chat_body)
    response = staticmethod(message_object)
    writer = MessagesWriter

    def error(self, err: GatewayError) -> dict:
        message = " ".join(str(err).split())[:1000]
        return {"type": "error", "error": {"type": ERROR_TYPES.get(err.status, "api_error"), "message": message,
                                           **({"code": err.code} if err.code else {})}}
