"""Chat requests to token ids and sampled text to OpenAI messages, through the chat template and a registered
tool-call format (envs/formats.py), as a multi-turn environment's episode renders them.

`shown(request, fmt)`: the messages as the template sees them: the request's tools shown in the system message
the way ToolEnvironment shows them (the format's `system_prompt`, after the request's own system text), an
assistant message's calls written out as the format writes calls, tool results as `tool` messages.
`reply(text, fmt)`: an assistant turn as OpenAI's message: its content without the call blocks, and the calls
the format parses from it as `tool_calls`. Pure Python.
"""
from __future__ import annotations

import json
from typing import Dict, List, Optional, Sequence

from alignment.envs.formats import ToolCallFormat
from alignment.gateway.protocol import ChatRequest, Message, ToolCallMessage


def shown(messages: Sequence[Message], tools: Sequence[dict], fmt: ToolCallFormat) -> List[Dict[str, str]]:
    """The request's messages as {"role", "content"} dicts for the chat template."""
    out = [{"role": m.role, "content": written(m, fmt)} for m in messages]
    if tools:
        listing = fmt.system_prompt(list(tools))
        if out[0]["role"] == "system":
            out[0] = {"role": "system", "content": f"{out[0]['content']}\n\n{listing}"}
        else:
            out.insert(0, {"role": "system", "content": listing})
    return out


def written(message: Message, fmt: ToolCallFormat) -> str:
    """A message's text: an assistant's calls appended as the format writes them."""
    calls = [fmt.format_call(call.name, call.arguments) for call in message.tool_calls]
    return "\n".join(part for part in [message.content] + calls if part)


def cut(text: str, stops: Sequence[str] = ()) -> str:
    """The text before the first of the request's `stops` (OpenAI's stop sequences are not returned)."""
    for stop in stops:
        if stop in text:
            text = text[: text.index(stop)]
    return text


def reply(text: str, fmt: ToolCallFormat, stops: Sequence[str] = ()) -> Message:
    """The assistant's turn as a Message: text cut before the first of the request's `stops` (OpenAI's stop
    sequences are not returned), calls parsed by the format (ids call_<n>), the rest as content."""
    text = cut(text, stops)
    calls = [c for c in fmt.parse(text) if c.error is None]
    content = text
    if calls and hasattr(fmt, "OPEN"):
        content = text[: text.index(fmt.OPEN)].strip()
    return Message("assistant", content, tuple(ToolCallMessage(f"call_{i}", c.name, c.arguments)
                                               for i, c in enumerate(calls)))


def message_json(message: Message) -> dict:
    """An assistant Message as the response's `message` object."""
    out = {"role": "assistant", "content": message.content if message.content or not message.tool_calls else None}
    if message.tool_calls:
        out["tool_calls"] = [{"id": c.id, "type": "function",
                              "function": {"name": c.name, "arguments": json.dumps(c.arguments, ensure_ascii=False)}}
                             for c in message.tool_calls]
    return out


def extension(previous: Sequence[Message], tools_before: Sequence[dict],
              request: ChatRequest) -> Optional[List[Message]]:
    """The messages `request` adds after a session's `previous` ones (its last one the gateway's reply), or None
    when it does not extend them: other tools, an edited or dropped message, or no new non-assistant message.
    Messages compare by what the template shows of them (call ids and tool_call_id aside)."""
    k = len(previous)
    if list(request.tools) != list(tools_before) or len(request.messages) <= k:
        return None
    if [_shown_key(m) for m in request.messages[:k]] != [_shown_key(m) for m in previous]:
        return None
    added = list(request.messages[k:])
    return None if any(m.role == "assistant" for m in added) else added


def _shown_key(m: Message) -> tuple:
    return m.role, m.content, tuple((c.name, json.dumps(c.arguments, sort_keys=True)) for c in m.tool_calls)
