"""Server-sent events as the three protocols stream them: `data: <json>` lines (chat completions, ended by
`data: [DONE]`) or `event: <type>` + `data: <json>` (Responses, Anthropic Messages), each event ended by a blank line.

A streamed call is sampled exactly as the same call unstreamed (the same tokens, log-probs and recorded turn), and
its events go out as the engine decodes: after each engine step the backend (backend.py) puts into the call's `Feed`
a `Delta` per choice whose turn has more text that no later token can change (`settled`), carrying the log-probs
of the tokens sampled since the choice's previous delta; at the turn's end it puts the call's `Outcome`, from which
the route's `Writer` sends what the deltas did not (the text held back, the tool calls, whole, as the format parses
them) and the finish. The concatenated deltas are the unstreamed reply's content, bit for bit."""
from __future__ import annotations

import asyncio
import dataclasses
import json
from typing import Iterator, Optional, Sequence

from alignment.gateway.outcome import Outcome

DONE = "data: [DONE]\n\n"
INCOMPLETE = "\ufffd"  # what the detokenizer writes for a character whose bytes are not all sampled yet


def event(data: dict, name: Optional[str] = None) -> str:
    """One server-sent event: `data` as one JSON line, after an `event:` line when named."""
    head = f"event: {name}\n" if name else ""
    return f"{head}data: {json.dumps(data, ensure_ascii=False)}\n\n"


def settled(text: str, stops: Sequence[str], call_open: Optional[str]) -> str:
    """The part of a turn's text decoded so far that the reply's content keeps whatever tokens follow: up to its
    last complete character, before a stop string (the reply is cut there) and before a tail that could begin one;
    with a tool-call format that opens calls with `call_open` (a reply with calls keeps the text before the call,
    stripped), also before a tail that could open a call and before trailing whitespace, and nothing while the
    text starts with whitespace."""
    text = text.rstrip(INCOMPLETE)
    held = tuple(stops) + ((call_open,) if call_open else ())
    for string in held:
        if string in text:
            text = text[: text.index(string)]
    for n in range(min(len(text), max(map(len, held), default=1) - 1), 0, -1):
        if any(string.startswith(text[-n:]) for string in held):
            text = text[:-n]
            break
    if call_open:
        text = "" if text[:1].isspace() else text.rstrip()
    return text


@dataclasses.dataclass(frozen=True)
class Delta:
    index: int  # the choice
    text: str  # its content settled since its previous delta
    logprobs: tuple = ()  # the entries of the tokens sampled since then (when the call asked for log-probs)


class Feed:
    """A streamed call's items from the pumping thread to the server's event loop: the call's head as it starts
    (an Outcome without choices: its id, model, prompt tokens), its Deltas, then its Outcome or a GatewayError.
    `sent`: per choice, the text and the count of tokens its deltas carried (kept by the backend)."""

    def __init__(self, loop: asyncio.AbstractEventLoop):
        self.loop, self.items = loop, asyncio.Queue()
        self.call = None  # the backend's Call
        self.sent: dict = {}
        self.over = False  # the call's Outcome or error was taken

    def put(self, item) -> None:
        """From any thread."""
        try:
            self.loop.call_soon_threadsafe(self.items.put_nowait, item)
        except RuntimeError:  # the server's loop is closed: nobody listens
            pass

    def finish(self, future) -> None:
        """The call's future is done: its Outcome or its error ends the feed."""
        self.put(future.exception() or future.result())

    def advance(self, index: int, text: str, tokens: int):
        """(the text beyond what choice `index` sent, the first token not sent) when `text`, settled, extends it."""
        sent, first = self.sent.get(index, ("", 0))
        if len(text) <= len(sent) or not text.startswith(sent):
            return None
        self.sent[index] = (text, tokens)
        return text[len(sent):], first

    async def get(self):
        item = await self.items.get()
        self.over = not isinstance(item, Delta) and (isinstance(item, Exception) or bool(item.choices))
        if isinstance(item, Exception):
            raise item
        return item


def head_of(outcome: Outcome) -> Outcome:
    """What a stream's first events tell of a call: the outcome without its choices."""
    return dataclasses.replace(outcome, choices=(), completion_tokens=0)


class Writer:
    """A streamed answer in one protocol: `start(head)` as the call starts, `delta` per Delta, `finish(outcome)`
    at the end (the content the deltas did not send, the tool calls, the finish); each -> server-sent events."""

    def __init__(self, request):
        self.request = request
        self.sent: dict = {}  # choice index -> [its text so far, its log-prob entries so far]

    def write(self, item) -> Iterator[str]:
        if isinstance(item, Delta):
            sent = self.sent.setdefault(item.index, ["", 0])
            sent[0], sent[1] = sent[0] + item.text, sent[1] + len(item.logprobs)
            return self.delta(item)
        return self.finish(item)

    def rest(self, index: int, choice) -> tuple:
        """(the choice's content beyond what its deltas sent, its log-prob entries beyond them)."""
        text, count = self.sent.get(index, ("", 0))
        content = choice.message.content or ""
        if not content.startswith(text):
            raise AssertionError(f"streamed {text!r}, which does not begin the reply {content!r}")
        return content[len(text):], tuple(choice.logprobs or ())[count:]

    def whole(self, outcome: Outcome) -> Iterator[str]:
        """The events of a call answered at once (no deltas)."""
        yield from self.start(head_of(outcome))
        yield from self.finish(outcome)

    def start(self, head: Outcome) -> Iterator[str]:
        raise NotImplementedError

    def delta(self, delta: Delta) -> Iterator[str]:
        raise NotImplementedError

    def finish(self, outcome: Outcome) -> Iterator[str]:
        raise NotImplementedError


class TypedWriter(Writer):
    """Events named by their own "type" (Responses, Anthropic Messages)."""

    def send(self, data: dict) -> str:
        return event(data, data["type"])
