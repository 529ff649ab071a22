"""The reward server's requests: its limits, and each body checked and turned into Work (rows to score) before
anything is tokenised. A bad request is an HTTPProblem: a 4xx status and a one-line message naming the field."""
from __future__ import annotations

import dataclasses
import hmac
import json
from typing import List, Optional

import numpy as np
from fastapi import Request

from alignment.inputs import has_lone_surrogate
from alignment.rewards.scoring import ScoreRow


@dataclasses.dataclass
class ServerLimits:
    max_batch: int = 32  # rows per merged forward pass
    max_wait_ms: float = 0.0  # how long the first waiting request waits for others (0: only those already queued)
    max_queue: int = 64  # requests waiting; more get 503
    max_rows: int = 1024  # rows per request
    max_body_bytes: int = 16 * 2 ** 20
    max_chars: int = 65536  # characters per text (a prompt's turns together); more: 413
    max_request_chars: int = 2 ** 20  # characters of all texts of one request; more: 413
    batching: bool = True  # False: every request is a forward pass of its own
    token: Optional[str] = None  # bearer token POST and /metrics need


class HTTPProblem(Exception):
    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


@dataclasses.dataclass
class Work:
    rows: List[ScoreRow]
    layout: Optional[tuple] = None  # (input_ids, attention_mask) [N, W]: scored alone, as sent
    future: Optional[asyncio.Future] = None


def _list(body: dict, key: str, kinds, required: bool = True, nullable: bool = False) -> Optional[list]:
    if key not in body or body[key] is None:
        if required:
            raise HTTPProblem(400, f"field {key!r} is missing")
        return None
    value = body[key]
    if not isinstance(value, list):
        raise HTTPProblem(400, f"field {key!r} must be a list, got {type(value).__name__}")
    for i, item in enumerate(value):
        if item is None and nullable:
            continue
        if not isinstance(item, kinds) or (isinstance(item, list) and not all(isinstance(t, str) for t in item)):
            raise HTTPProblem(400, f"field {key!r} item {i} must be {_kind_name(kinds, nullable)}, "
                                  f"got {type(item).__name__}")
    return value


def _kind_name(kinds, nullable: bool) -> str:
    names = {str: "a string", list: "a list of strings (turns)"}
    return " or ".join([names[k] for k in (kinds if isinstance(kinds, tuple) else (kinds,))] +
                       (["null"] if nullable else []))


def _same_lengths(limits: ServerLimits, **lists) -> int:
    """The row count of the request's text lists, after checking their lengths and sizes against `limits`."""
    (first, items), *others = [(k, v) for k, v in lists.items() if v is not None]
    for key, value in others:
        if len(value) != len(items):
            raise HTTPProblem(400, f"field {key!r} has {len(value)} items but {first!r} has {len(items)}")
    if len(items) > limits.max_rows:
        raise HTTPProblem(413, f"field {first!r} has {len(items)} rows; the limit is {limits.max_rows} (--max-rows)")
    total = 0
    for key, value in lists.items():
        for i, item in enumerate(value or ()):
            size = len(item) if isinstance(item, str) else sum(map(len, item or ()))
            if size > limits.max_chars:
                raise HTTPProblem(413, f"field {key!r} item {i}: {size} characters; the limit is {limits.max_chars} "
                                      "(--max-chars)")
            total += size
    if total > limits.max_request_chars:
        raise HTTPProblem(413, f"the request's texts hold {total} characters; the limit is "
                              f"{limits.max_request_chars} (--max-request-chars)")
    return len(items)


def _matrix(body: dict, key: str, rows: int, low: int, high: int, max_width: Optional[int] = None) -> np.ndarray:
    """A rectangular [rows, W] int matrix with values in [low, high), W <= max_width."""
    value = body.get(key)
    if not isinstance(value, list) or len(value) != rows or not all(isinstance(r, list) for r in value):
        raise HTTPProblem(400, f"field {key!r} must be a list of {rows} lists of integers (one per row)")
    widths = {len(r) for r in value}
    if len(widths) != 1 or 0 in widths:
        raise HTTPProblem(400, f"field {key!r} must be padded to one width (got widths {sorted(widths)[:4]})")
    if max_width is not None and widths.pop() > max_width:
        raise HTTPProblem(413, f"field {key!r} rows are {len(value[0])} tokens wide; the score model reads at most "
                              f"{max_width} positions")
    if not all(type(t) is int for r in value for t in r):
        raise HTTPProblem(400, f"field {key!r} must hold integers only")
    out = np.asarray(value, dtype="object")
    if out.min() < low or out.max() >= high:
        raise HTTPProblem(400, f"field {key!r} has values outside [{low}, {high})")
    return out.astype("int64")


def paddlenlp_work(body: dict, limits: ServerLimits, fingerprint: Optional[str], vocab_size: int,
                   max_positions: Optional[int] = None) -> Work:
    src = _list(body, "src", (str, list))
    tgt = _list(body, "tgt", str, required=False, nullable=True)
    response = _list(body, "response", str)
    n = _same_lengths(limits, src=src, tgt=tgt, response=response)
    tgt = tgt or [None] * n
    rows = [ScoreRow(prompt=s, response=r, label=t) for s, t, r in zip(src, tgt, response)]
    layout = None
    if body.get("input_ids") is not None and n:
        token = body.get("tokenizer")
        if not isinstance(token, str):
            raise HTTPProblem(400, "field 'tokenizer' (the client tokenizer's fingerprint) must come with 'input_ids'")
        if fingerprint is not None and hmac.compare_digest(token, fingerprint):  # else: re-tokenize the text
            ids = _matrix(body, "input_ids", n, 0, vocab_size, max_positions)
            mask = _matrix(body, "attention_mask", n, 0, 2)
            if ids.shape != mask.shape or not mask.any(axis=1).all():
                raise HTTPProblem(400, "field 'attention_mask' must match 'input_ids' and mark a token in every row")
            layout = (ids, mask)
    return Work(rows, layout)


def openrlhf_work(body: dict, limits: ServerLimits) -> Work:
    query = _list(body, "query", str)
    prompts = _list(body, "prompts", str, required=False)
    labels = _list(body, "labels", str, required=False, nullable=True)
    n = _same_lengths(limits, query=query, prompts=prompts, labels=labels)
    prompts, labels = prompts or [""] * n, labels or [None] * n
    rows = [ScoreRow(prompt=p, response=q[len(p):] if q.startswith(p) else q, label=l, query=q)
            for q, p, l in zip(query, prompts, labels)]
    return Work(rows)


async def read_json(request: Request, limit: int) -> dict:
    """The body as a JSON object, read at most `limit` bytes far."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise HTTPProblem(413, f"body: {declared} bytes; the limit is {limit} (--max-body-mb)")
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise HTTPProblem(413, f"body: more than {limit} bytes (--max-body-mb)")
        chunks.append(chunk)
    try:
        body = json.loads(b"".join(chunks))
    except (UnicodeDecodeError, ValueError) as err:
        raise HTTPProblem(400, f"body: not valid JSON ({err})") from None
    except RecursionError:
        raise HTTPProblem(400, "body: JSON nested too deeply") from None
    if has_lone_surrogate(body):
        raise HTTPProblem(400, "body: a lone UTF-16 surrogate escape (\\ud800-\\udfff) is not text")
    if not isinstance(body, dict):
        raise HTTPProblem(400, f"body: expected a JSON object, got {type(body).__name__}")
    return body
