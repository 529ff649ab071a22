"""OpenAI chat completions (`POST /v1/chat/completions`): the response object, and with `stream: true` its
chunks (`chat.completion.chunk`: the role, the content as it is decoded with its tokens' log-probs, each tool call,
the finish reason; with `stream_options.include_usage` a last chunk holding the usage), then `data: [DONE]`."""
from __future__ import annotations

from typing import Iterator, Optional

from alignment.gateway import render, streaming
from alignment.gateway.outcome import Choice, Outcome, check_finishes
from alignment.gateway.protocol import ChatRequest
from alignment.gateway.route import Route

# a turn the episode's token budget cut answers as one capped by max_tokens; the session then refuses further calls
# with 400 context_length_exceeded (backend.py)
FINISH = check_finishes({"eos": "stop", "stop": "stop", "length": "length", "budget": "length"}, "chat completions")


def finish_reason(choice: Choice) -> str:
    return "tool_calls" if choice.message.tool_calls else FINISH[choice.ending]


def usage(outcome: Outcome) -> dict:
    return {"prompt_tokens": outcome.prompt_tokens, "completion_tokens": outcome.completion_tokens,
            "total_tokens": outcome.prompt_tokens + outcome.completion_tokens}


class ChatCompletions(Route):
    PATH = "chat/completions"
    NAME = "chat completions"

    def response(self, outcome: Outcome, request: ChatRequest) -> dict:
        choices = []
        for index, choice in enumerate(outcome.choices):
            entry = {"index": index, "message": render.message_json(choice.message),
                     "finish_reason": finish_reason(choice)}
            if choice.logprobs is not None:
                entry["logprobs"] = {"content": list(choice.logprobs)}
            choices.append(entry)
        return {"id": f"chatcmpl-{outcome.id}", "object": "chat.completion", "created": outcome.created,
                "model": outcome.model, "choices": choices, "usage": usage(outcome)}

    def writer(self, request: ChatRequest) -> "ChatWriter":
        return ChatWriter(request)


class ChatWriter(streaming.Writer):
    """Chunks: each choice's role, its content deltas with their tokens' log-probs, the rest of its content, its
    tool calls (each whole, as the format parses them at the turn's end), its finish; the usage; `[DONE]`."""

    def chunk(self, index: int, delta: dict, finish=None, logprobs=None) -> str:
        body = {**self.head, "choices": [{"index": index, "delta": delta, "logprobs": logprobs,
                                          "finish_reason": finish}]}
        return streaming.event({**body, "usage": None} if self.request.stream_usage else body)

    def logprobs(self, entries) -> Optional[dict]:
        return {"content": list(entries)} if self.request.logprobs or entries else None

    def start(self, head: Outcome) -> Iterator[str]:
        self.head = {"id": f"chatcmpl-{head.id}", "object": "chat.completion.chunk", "created": head.created,
                     "model": head.model}
        self.opened = set()
        return iter(())

    def role(self, index: int) -> Iterator[str]:
        """A choice's first chunk (its role), once."""
        if index not in self.opened:
            self.opened.add(index)
            yield self.chunk(index, {"role": "assistant", "content": ""})

    def delta(self, delta: streaming.Delta) -> Iterator[str]:
        yield from self.role(delta.index)
        yield self.chunk(delta.index, {"content": delta.text}, logprobs=self.logprobs(delta.logprobs))

    def finish(self, outcome: Outcome) -> Iterator[str]:
        for index, choice in enumerate(outcome.choices):
            yield from self.role(index)
            text, entries = self.rest(index, choice)
            if text or entries:
                yield self.chunk(index, {"content": text}, logprobs=self.logprobs(entries))
            for j, call in enumerate(render.message_json(choice.message).get("tool_calls", [])):
                yield self.chunk(index, {"tool_calls": [{"index": j, **call}]})
            yield self.chunk(index, {}, finish_reason(choice))
        if self.request.stream_usage:
            yield streaming.event({**self.head, "choices": [], "usage": usage(outcome)})
        yield streaming.DONE
