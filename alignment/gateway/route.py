"""The gateway's protocols, one `Route` each, registered by the path they serve under `/v1/` (and under a
session's `/sessions/<id>/v1/`): `chat/completions` (chat_completions.py), `responses` (responses.py), `messages`
(anthropic_messages.py). A route checks a body into the one `ChatRequest` the backend samples, and writes the
call's `Outcome` back as its protocol's response object or, streamed, its events (a `Writer`: the deltas
as the turn is decoded, then the rest from the outcome); its errors take the protocol's shape.
Pure Python."""
from __future__ import annotations

from typing import Dict, Iterator

from alignment.gateway import streaming
from alignment.gateway.outcome import Outcome
from alignment.gateway.protocol import ChatRequest, GatewayError, Limits, parse_chat_request

ROUTES: Dict[str, "Route"] = {}


class Route:
    PATH = ""  # under /v1/
    NAME = ""  # the protocol, as messages name it

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        if cls.__dict__.get("PATH"):
            if cls.PATH in ROUTES and type(ROUTES[cls.PATH]).__qualname__ != cls.__qualname__:
                raise ValueError(f"gateway route {cls.PATH!r} is already served by {type(ROUTES[cls.PATH]).__name__}")
            ROUTES[cls.PATH] = cls()

    def translate(self, body, limits: Limits):
        """The chat-completions body of the same request (checked as far as the protocol's own parameters go)."""
        return body

    def parse(self, body, limits: Limits) -> ChatRequest:
        return parse_chat_request(self.translate(body, limits), limits)

    def response(self, outcome: Outcome, request: ChatRequest) -> dict:
        raise NotImplementedError

    def writer(self, request: ChatRequest) -> streaming.Writer:
        """The writer of a streamed answer's server-sent events (streaming.py)."""
        raise NotImplementedError

    def events(self, outcome: Outcome, request: ChatRequest) -> Iterator[str]:
        """The server-sent events of a streamed answer written at once from its outcome (no deltas)."""
        return self.writer(request).whole(outcome)

    def error(self, err: GatewayError) -> dict:
        """The body of an error answer: OpenAI's error object unless the protocol has its own."""
        return err.body()
