"""OpenAI Responses (`POST /v1/responses`) with function tools, streamed or not, as the `openai` client's
`responses.create` speaks it; nothing is stored (no `previous_response_id`: an agent sends its whole conversation).

The request becomes the chat-completions request of the same conversation: `instructions` a system message; each
`input` item a message (`developer` as `system`), a `function_call` item a call of the assistant message before it
(as the response's own `output` holds a turn: its text, then its calls), a `function_call_output` a `tool`
message; a function tool `{"type": "function", "name", ...}` the chat tool `{"type": "function", "function":
{"name", ...}}`, its keys in their order. The outcome becomes `output` items: the text as a `message` (its
`output_text` log-probs with `include: ["message.output_text.logprobs"]`), each call a `function_call`. A turn cut at
`max_output_tokens` (or at the episode's token budget, as chat completions answer it) has status `incomplete`,
`incomplete_details.reason` "max_output_tokens"."""
from __future__ import annotations

from typing import Iterator, List

from alignment.gateway import render, streaming
from alignment.gateway.outcome import Outcome, check_finishes
from alignment.gateway.protocol import ChatRequest, GatewayError, Limits, flag, number
from alignment.gateway.route import Route

# ending -> None (status "completed") or the reason of an "incomplete" response; a turn with calls is completed
FINISH = check_finishes({"eos": None, "stop": None, "length": "max_output_tokens", "budget": "max_output_tokens"},
                        "responses")
ROLES = {"user": "user", "system": "system", "developer": "system", "assistant": "assistant"}
TEXT_PARTS = ("input_text", "output_text")
LOGPROBS = "message.output_text.logprobs"
UNSERVED = ("previous_response_id", "conversation", "background", "prompt")  # all need responses kept


def _invalid(message: str, param: str) -> GatewayError:
    return GatewayError(400, message, param)


def _text(value, where: str) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, list) and all(isinstance(p, dict) and p.get("type") in TEXT_PARTS and
                                       isinstance(p.get("text"), str) for p in value):
        return "".join(p["text"] for p in value)
    raise _invalid(f"{where} must be a string or a list of input_text / output_text parts (other content types "
                   f"are not served)", where)


def _message(item: dict, where: str, messages: List[dict]) -> None:
    role = ROLES.get(item.get("role"))
    if role is None:
        raise _invalid(f"{where}.role must be one of {sorted(ROLES)}", f"{where}.role")
    messages.append({"role": role, "content": _text(item.get("content"), f"{where}.content")})


def _function_call(item: dict, where: str, messages: List[dict]) -> None:
    if not isinstance(item.get("name"), str) or not isinstance(item.get("arguments"), str):
        raise _invalid(f"{where} must be {{'type': 'function_call', 'call_id', 'name', 'arguments': a JSON string}}",
                       where)
    call = {"id": str(item.get("call_id", "")), "type": "function",
            "function": {"name": item["name"], "arguments": item["arguments"]}}
    if messages and messages[-1]["role"] == "assistant":  # the turn's text came first
        messages[-1].setdefault("tool_calls", []).append(call)
    else:
        messages.append({"role": "assistant", "content": "", "tool_calls": [call]})


def _function_call_output(item: dict, where: str, messages: List[dict]) -> None:
    messages.append({"role": "tool", "tool_call_id": str(item.get("call_id", "")),
                     "content": _text(item.get("output"), f"{where}.output")})


ITEMS = {"message": _message, "function_call": _function_call, "function_call_output": _function_call_output}


def chat_body(body, limits: Limits) -> dict:
    """The chat-completions body of a Responses request; a GatewayError naming the Responses parameter."""
    if not isinstance(body, dict):
        raise _invalid("the body must be a JSON object", None)
    for key in UNSERVED:
        if body.get(key):
            raise _invalid(f"'{key}' is not served: the gateway keeps no responses; send the whole conversation as "
                           f"'input'", key)
    items = body.get("input")
    items = [{"role": "user", "content": items}] if isinstance(items, str) else items
    if not isinstance(items, list) or not items:
        raise _invalid("'input' must be a string or a non-empty list of items", "input")
    if len(items) > limits.max_messages:
        raise GatewayError(413, f"'input' has {len(items)} items; the limit is {limits.max_messages}", "input")
    instructions = body.get("instructions")
    if instructions is not None and not isinstance(instructions, str):
        raise _invalid("'instructions' must be a string", "instructions")
    messages = [{"role": "system", "content": instructions}] if instructions else []
    for i, item in enumerate(items):
        where = f"input[{i}]"
        handler = ITEMS.get(item.get("type", "message")) if isinstance(item, dict) else None
        if handler is None:
            raise _invalid(f"{where} must be an item of type {' / '.join(ITEMS)} (others are not served)", where)
        handler(item, where, messages)
    tools = body.get("tools") or []
    if not isinstance(tools, list) or not all(isinstance(t, dict) and t.get("type") == "function" and
                                              isinstance(t.get("name"), str) for t in tools):
        raise _invalid("'tools' must be a list of {'type': 'function', 'name', 'parameters', ...} (other tool types "
                       "are not served)", "tools")
    include = body.get("include") or []
    if not isinstance(include, list) or not all(isinstance(i, str) for i in include):
        raise _invalid("'include' must be a list of strings", "include")
    top = number(body, "top_logprobs", 0, 20, True)
    return {"messages": messages, "model": body.get("model", ""), "stream": flag(body, "stream"),
            "tools": [{"type": "function", "function": {k: v for k, v in t.items() if k != "type"}} for t in tools],
            "max_completion_tokens": number(body, "max_output_tokens", 1, 1 << 20, True),
            "temperature": body.get("temperature"), "top_p": body.get("top_p"), "logprobs": LOGPROBS in include,
            "top_logprobs": top if LOGPROBS in include else None}


def output_items(outcome: Outcome) -> List[dict]:
    """The turn as `output` items: its text as a message (none when it only calls), then each call."""
    choice = outcome.first
    message, items = choice.message, []
    if message.content or not message.tool_calls:
        part = {"type": "output_text", "text": message.content, "annotations": [],
                "logprobs": list(choice.logprobs or ())}
        items.append({"id": f"msg_{outcome.id}", "type": "message", "role": "assistant", "content": [part],
                      "status": "incomplete" if status(outcome) == "incomplete" else "completed"})
    for j, call in enumerate(render.message_json(message).get("tool_calls", [])):
        items.append({"id": f"fc_{outcome.id}_{j}", "type": "function_call", "status": "completed",
                      "call_id": call["id"], "name": call["function"]["name"],
                      "arguments": call["function"]["arguments"]})
    return items


def status(outcome: Outcome) -> str:
    choice = outcome.first
    return "incomplete" if FINISH[choice.ending] and not choice.message.tool_calls else "completed"


def response_object(outcome: Outcome, request: ChatRequest, done: bool = True) -> dict:
    """The response; `done` false: as a stream starts (in progress, no output yet)."""
    state = status(outcome) if done else "in_progress"
    return {"id": f"resp_{outcome.id}", "object": "response", "created_at": outcome.created, "status": state,
            "error": None, "incomplete_details": {"reason": FINISH[outcome.first.ending]}
            if state == "incomplete" else None, "instructions": None, "model": outcome.model,
            "output": output_items(outcome) if done else [], "parallel_tool_calls": True, "tool_choice": "auto",
            "tools": [{"type": "function", **t["function"]} for t in request.tools],
            "temperature": request.temperature, "top_p": request.top_p, "max_output_tokens": request.max_tokens,
            "metadata": {}, "text": {"format": {"type": "text"}},
            "usage": {"input_tokens": outcome.prompt_tokens, "input_tokens_details": {"cached_tokens": 0},
                      "output_tokens": outcome.completion_tokens, "output_tokens_details": {"reasoning_tokens": 0},
                      "total_tokens": outcome.prompt_tokens + outcome.completion_tokens} if done else None}


class ResponsesWriter(streaming.TypedWriter):
    """The Responses stream, numbered (`sequence_number`): created, in progress; the message item as its text is
    decoded (added, its part added, a delta per Delta with its tokens' log-probs, the rest, done); each
    function_call item whole (added, its arguments, done); then completed (or incomplete) with the whole response."""

    def send(self, data: dict) -> str:
        self.number += 1
        return super().send({**data, "sequence_number": self.number - 1})

    def start(self, head: Outcome) -> Iterator[str]:
        self.number, self.opened, self.id = 0, False, head.id
        start = response_object(head, self.request, done=False)
        yield self.send({"type": "response.created", "response": start})
        yield self.send({"type": "response.in_progress", "response": start})

    def text(self, text: str, logprobs: tuple) -> Iterator[str]:
        where = {"item_id": f"msg_{self.id}", "output_index": 0, "content_index": 0}
        if not self.opened:
            self.opened = True
            yield self.send({"type": "response.output_item.added", "output_index": 0, "item": {
                "id": where["item_id"], "type": "message", "role": "assistant", "content": [],
                "status": "in_progress"}})
            yield self.send({"type": "response.content_part.added", **where, "part": {
                "type": "output_text", "text": "", "annotations": [], "logprobs": []}})
        if text or logprobs:
            yield self.send({"type": "response.output_text.delta", **where, "delta": text,
                             "logprobs": list(logprobs)})

    def delta(self, delta: streaming.Delta) -> Iterator[str]:
        return self.text(delta.text, delta.logprobs)

    def finish(self, outcome: Outcome) -> Iterator[str]:
        items = output_items(outcome)
        for index, item in enumerate(items):
            where = {"item_id": item["id"], "output_index": index}
            if item["type"] == "message":
                part = item["content"][0]
                yield from self.text(*self.rest(0, outcome.first))
                yield self.send({"type": "response.output_text.done", **where, "content_index": 0,
                                 "text": part["text"], "logprobs": part["logprobs"]})
                yield self.send({"type": "response.content_part.done", **where, "content_index": 0, "part": part})
            else:
                yield self.send({"type": "response.output_item.added", "output_index": index,
                                 "item": {**item, "status": "in_progress", "arguments": ""}})
                yield self.send({"type": "response.function_call_arguments.delta", **where,
                                 "delta": item["arguments"]})
                yield self.send({"type": "response.function_call_arguments.done", **where, "name": item["name"],
                                 "arguments": item["arguments"]})
            yield self.send({"type": "response.output_item.done", "output_index": index, "item": item})
        final = response_object(outcome, self.request)
        yield self.send({"type": f"response.{final['status']}", "response": final})


class Responses(Route):
    PATH = "responses"
    NAME = "responses"
    translate = staticmethod(chat_body)
    response = staticmethod(response_object)
    writer = ResponsesWriter
