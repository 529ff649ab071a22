"""OpenAI chat completions (`POST /v1/chat/completions`): the response object, and with `stream: true` its
chunks (`chat.completion.chunk`: the role, the content with its log-probs, each tool call, the finish reason; with
`stream_options.include_usage` a last chunk holding the usage), then `data: [DONE]`."""
from __future__ import annotations

from typing import Iterator

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

    def events(self, outcome: Outcome, request: ChatRequest) -> Iterator[str]:
        head = {"id": f"chatcmpl-{outcome.id}", "object": "chat.completion.chunk", "created": outcome.created,
                "model": outcome.model}

        def chunk(index: int, delta: dict, finish=None, logprobs=None) -> str:
            body = {**head, "choices": [{"index": index, "delta": delta, "logprobs": logprobs,
                                         "finish_reason": finish}]}
            return streaming.event({**body, "usage": None} if request.stream_usage else body)

        for index, choice in enumerate(outcome.choices):
            yield chunk(index, {"role": "assistant", "content": ""})
            if choice.message.content or choice.logprobs:
                yield chunk(index, {"content": choice.message.content}, logprobs=None if choice.logprobs is None
                            else {"content": list(choice.logprobs)})
            for j, call in enumerate(render.message_json(choice.message).get("tool_calls", [])):
                yield chunk(index, {"tool_calls": [{"index": j, **call}]})
            yield chunk(index, {}, finish_reason(choice))
        if request.stream_usage:
            yield streaming.event({**head, "choices": [], "usage": usage(outcome)})
        yield streaming.DONE
