"""Server-sent events as the three protocols stream them: `data: <json>` lines (chat completions, ended by
`data: [DONE]`) or `event: <type>` + `data: <json>` (Responses, Anthropic Messages), each event ended by a blank line.

A streamed call is sampled exactly as the same call unstreamed (the same tokens, log-probs and recorded turn): the
route waits for the call's outcome, then writes it as the protocol's sequence of events."""
from __future__ import annotations

import json
from typing import Iterable, Iterator, Optional
DONE = "data: [DONE]\n\n"


def event(data: dict, name: Optional[str] = None) -> str:
    """One server-sent event: `data` as one JSON line, after an `event:` line when named."""
    head = f"event: {name}\n" if name else ""
    return f"{head}data: {json.dumps(data, ensure_ascii=False)}\n\n"


def typed_events(events: Iterable[dict]) -> Iterator[str]:
    """Events named by their own "type" (Responses, Anthropic Messages)."""
    for data in events:
        yield event(data, data["type"])

