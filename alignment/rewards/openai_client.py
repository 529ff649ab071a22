"""A client of an OpenAI-compatible server (vLLM's `vllm serve`, the gateway `alignment-serve`), with the reward
server's retries and fail-over (remote.py: connection errors, timeouts, 5xx / 429 / 408 retried, then one error
naming the server). Two calls:

- `prompt_log_probs`: a served teacher's log-probs of token sequences. `POST {base}/completions` with
  {"model", "prompt": [[token ids], ...], "echo": true, "max_tokens": 1, "logprobs": k, "temperature": 1.0,
  "return_tokens_as_token_ids": true}; read back: `choices[i].index`, `choices[i].logprobs.token_logprobs` (the
  log-prob of each echoed token; null for the first) and `choices[i].logprobs.top_logprobs` (per position a
  {"token_id:<id>": log-prob} map of at least k entries; vLLM adds the echoed token's own). The generated token
  after the prompt is ignored.
- `chat`: a judge's answer. `POST {base}/chat/completions` with {"model", "messages", "max_tokens",
  "temperature", and with `top_logprobs` "logprobs": true, "top_logprobs": n}; read back
  `choices[0].message.content` and `choices[0].logprobs.content[0].top_logprobs` ([{"token", "logprob"}]).
"""
from __future__ import annotations

from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from alignment.rewards.remote import RewardServerClient, RewardServerError, one_line

TOKEN_ID_PREFIX = "token_id:"


class OpenAIEndpoint(RewardServerClient):
    """what: how messages name it ("teacher server", "judge 'helpful'"); url_key / retries_key / timeout_key: its
    argument keys; model: the served model's name (None: the first its /models lists, asked on first use)."""

    def __init__(self, urls: Sequence[str], what: str, keys: Tuple[str, str, str], token_variable: str,
                 model: Optional[str] = None, token: Optional[str] = None, timeout: float = 120.0, retries: int = 8,
                 backoff: float = 0.5, sleep=None):
        self.what, (self.url_key, self.retries_key, self.timeout_key) = what, keys
        self.token_variable = token_variable
        extra = {} if sleep is None else {"sleep": sleep}
        super().__init__(urls, token, timeout, retries, backoff, **extra)
        self.model = model

    def served_model(self) -> str:
        if self.model is None:
            answer, url, _ = self.call("GET", "/models", 0)
            models = answer.get("data") if isinstance(answer, dict) else None
            if not models or not isinstance(models[0], dict) or "id" not in models[0]:
                raise RewardServerError(f"{self.what} {url}/models lists no model: {one_line(answer, 120)}")
            self.model = models[0]["id"]
        return self.model

    def post(self, path: str, body: dict, parse):
        with self.lock:
            first, self.turn = self.turn, self.turn + 1
        answer, _, retries = self.call("POST", path, first, {"model": self.served_model(), **body}, parse=parse)
        return answer, retries

    def prompt_log_probs(self, sequences: List[List[int]], top_k: int):
        """Per sequence (token log-probs [L] float64, the first 0; top-k ids [L, k] int64; top-k log-probs [L, k]
        float64, row 0 zeros), and the retries made."""
        body = {"prompt": sequences, "echo": True, "max_tokens": 1, "logprobs": top_k, "temperature": 1.0,
                "return_tokens_as_token_ids": True}
        return self.post("/completions", body, lambda response, url: parse_prompt_log_probs(
            response.json(), url, self.what, [len(s) for s in sequences], top_k))

    def chat(self, messages: List[Dict[str, str]], max_tokens: int, temperature: float, top_logprobs: int = 0):
        """(text, [(first-token candidate, log-prob)] or None), and the retries made."""
        body = {"messages": messages, "max_tokens": max_tokens, "temperature": temperature}
        if top_logprobs:
            body.update(logprobs=True, top_logprobs=top_logprobs)
        return self.post("/chat/completions", body, lambda response, url: parse_chat(response.json(), url, self.what))


def _bad(what: str, url: str, problem: str) -> RewardServerError:
    return RewardServerError(f"{what} {url}: {problem}")


def token_id(key: str, what: str, url: str) -> int:
    if not isinstance(key, str) or not key.startswith(TOKEN_ID_PREFIX):
        raise _bad(what, url, f"top log-prob key {one_line(repr(key), 40)} is not 'token_id:<id>' (the server must "
                              "honour return_tokens_as_token_ids, as vLLM does)")
    return int(key[len(TOKEN_ID_PREFIX):])


def parse_prompt_log_probs(data, url: str, what: str, lengths: List[int], top_k: int):
    choices = data.get("choices") if isinstance(data, dict) else None
    if not isinstance(choices, list) or len(choices) != len(lengths):
        raise _bad(what, url, f"expected {len(lengths)} choices, got {one_line(repr(data), 120)}")
    out = []
    for row, choice in enumerate(sorted(choices, key=lambda c: c.get("index", 0))):
        logprobs = choice.get("logprobs") or {}
        tokens, tops, length = logprobs.get("token_logprobs"), logprobs.get("top_logprobs"), lengths[row]
        if not isinstance(tokens, list) or not isinstance(tops, list) or len(tokens) < length or len(tops) < length:
            raise _bad(what, url, f"choice {row}: no prompt log-probs for its {length} tokens (echo with logprobs)")
        ids, values = np.zeros([length, top_k], "int64"), np.zeros([length, top_k], "float64")
        for position in range(1, length):
            pairs = sorted(((float(v), token_id(k, what, url)) for k, v in (tops[position] or {}).items()),
                           reverse=True)[:top_k]
            if len(pairs) < top_k:
                raise _bad(what, url, f"choice {row}, position {position}: {len(pairs)} top log-probs, asked {top_k}")
            values[position], ids[position] = [v for v, _ in pairs], [i for _, i in pairs]
        token = np.asarray([0.0] + [float(v) for v in tokens[1:length]], "float64")
        if not np.all(np.isfinite(token)) or not np.all(np.isfinite(values)):
            raise _bad(what, url, f"choice {row}: a log-prob that is not a finite number")
        out.append((token, ids, values))
    return out


def parse_chat(data, url: str, what: str):
    try:
        choice = data["choices"][0]
        text = choice["message"]["content"]
    except (KeyError, IndexError, TypeError):
        raise _bad(what, url, f"no choices[0].message.content in {one_line(repr(data), 120)}") from None
    content = (choice.get("logprobs") or {}).get("content") or []
    top = None
    if content and isinstance(content[0], dict):
        top = [(entry["token"], float(entry["logprob"])) for entry in content[0].get("top_logprobs") or []]
    return text or "", top
