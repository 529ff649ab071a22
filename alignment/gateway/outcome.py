"""What a call of the gateway sampled, before any protocol shapes it: the choices (the assistant's turn as a
`Message`, how the turn ended, its tokens and their log-probs) and the token counts. Every route (chat
completions, Responses, Anthropic Messages; routes.py) turns a request into a `ChatRequest`, the backend answers it
with an `Outcome`, and the route writes that outcome back in its own protocol, streamed or not. Pure Python."""
from __future__ import annotations

import dataclasses
from typing import Optional

# How a turn ended (models/engine.py, DecodeSequence.ending): the model's end of turn, a stop string, the turn's
# max_tokens, the episode's token budget (max_trajectory_tokens; the session takes no further call).
ENDINGS = ("eos", "stop", "length", "budget")


@dataclasses.dataclass(frozen=True)
class Choice:
    message: object  # protocol.Message: the assistant's turn, its tool calls parsed
    ending: str  # one of ENDINGS
    text: str  # the turn's text as sampled (the closing eos text removed), before stop strings are cut
    tokens: tuple  # the sampled ids
    logprobs: Optional[tuple] = None  # per token {"token", "logprob", "bytes", "top_logprobs"} when asked for


@dataclasses.dataclass(frozen=True)
class Outcome:
    id: str  # unique per call of a session; each protocol prefixes it
    model: str
    created: int
    choices: tuple  # Choice
    prompt_tokens: int
    completion_tokens: int

    @property
    def first(self) -> Choice:
        return self.choices[0]


def check_finishes(table: dict, protocol: str) -> dict:
    """A protocol's finish table (ending -> its stop signal), checked to name every ending."""
    missing = [e for e in ENDINGS if e not in table]
    if missing:
        raise ValueError(f"{protocol}: no finish for the endings {missing}")
    return table
