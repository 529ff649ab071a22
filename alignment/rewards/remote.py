"""The client of a reward server (tools/reward_server.py, or any server of PaddleNLP's `POST /` protocol).

A rollout batch goes out as PaddleNLP's body {"src", "tgt", "response"} plus, for our own server, the rollout's
padded token ids, attention mask and the actor tokenizer's fingerprint: when the server's tokenizer has the same
fingerprint it scores those very tensors (bitwise the in-process reward), otherwise it re-tokenizes the text.

Failures: connection errors, timeouts, HTTP 5xx / 503 / 429 / 408 and PaddleNLP's error_code >= 500 are retried
(the next URL first, then exponential backoff, honouring Retry-After), `retries` times in all; any other answer
that is not exactly one finite number per row is an error naming the URL - never a silent wrong reward.
"""
from __future__ import annotations

import hashlib
import logging
import math
import os
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import httpx
import numpy as np

from alignment.rewards.errors import RewardFunctionError

RETRYABLE_STATUS = (408, 429, 500, 502, 503, 504)
MAX_BACKOFF = 16.0  # seconds between retry rounds at most (a longer Retry-After is honoured up to MAX_RETRY_AFTER)
MAX_RETRY_AFTER = 60.0
DOWN_FOR = 10.0  # seconds a failed URL goes to the back of the order


class RewardServerError(RewardFunctionError):
    """The reward server cannot give valid scores: unreachable past the retry budget, or a wrong answer. A
    RewardFunctionError (a ValueError), so the entry point stops with its one-line message."""


class Retry(Exception):
    """A failure worth another attempt (possibly at another URL)."""

    def __init__(self, message: str, retry_after: float = 0.0):
        super().__init__(message)
        self.retry_after = retry_after


def tokenizer_fingerprint(tokenizer) -> str:
    """A digest of what scoring.same_tokenizer compares: equal fingerprints <=> the same tokenizer."""
    text = tokenizer._tok.to_str() + "\0" + tokenizer.chat_template
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def one_line(text: str, limit: int = 200) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def error_message(response: httpx.Response) -> str:
    """The server's own reason (our and PaddleNLP's `error_msg`, FastAPI's `detail`) or the start of the body."""
    try:
        data = response.json()
        if isinstance(data, dict):
            return one_line(data.get("error_msg") or data.get("detail") or response.text)
    except ValueError:
        pass
    return one_line(response.text or response.reason_phrase)


def retry_after_seconds(response: httpx.Response) -> float:
    try:
        return min(MAX_RETRY_AFTER, max(0.0, float(response.headers.get("retry-after", 0))))
    except ValueError:  # an HTTP date: not worth parsing, back off normally
        return 0.0


def parse_scores(response: httpx.Response, url: str, rows: int) -> List[float]:
    """The `score` list of a 200 response, checked: a JSON object, error_code 0, exactly `rows` finite numbers."""
    try:
        data = response.json()
    except ValueError:
        raise RewardServerError(f"reward server {url}: the response is not JSON: {one_line(response.text, 80)!r}")
    if not isinstance(data, dict):
        raise RewardServerError(f"reward server {url}: the response is not a JSON object: {one_line(data, 80)}")
    code = data.get("error_code", 0)
    if code != 0:
        message = f"error_code {code}: {one_line(data.get('error_msg', ''))}"
        if isinstance(code, int) and code >= 500:
            raise Retry(message)
        raise RewardServerError(f"reward server {url}: {message}")
    scores = data.get("score")
    if not isinstance(scores, list):
        raise RewardServerError(f"reward server {url}: the response has no 'score' list: {one_line(data, 80)}")
    if len(scores) != rows:
        raise RewardServerError(f"reward server {url}: {len(scores)} scores for {rows} rows")
    out = []
    for i, value in enumerate(scores):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise RewardServerError(f"reward server {url}: score {i} is {one_line(repr(value), 80)}, not a number")
        try:
            value = float(value)  # an integer too large for a float raises OverflowError
        except OverflowError:
            value = math.inf
        if not math.isfinite(value):
            raise RewardServerError(f"reward server {url}: score {i} is {one_line(str(scores[i]), 40)}, not a "
                                    "finite float")
        out.append(value)
    return out


class RewardServerClient:
    # what the messages call the server, its keys and token variable (openai_client.py's subclass names others)
    what, url_key, retries_key, timeout_key, token_variable = ("reward server", "reward_server", "reward_server_retries",
                                                               "reward_server_timeout", "REWARD_SERVER_TOKEN")

    def __init__(self, urls: Sequence[str], token: Optional[str] = None, timeout: float = 60.0, retries: int = 8,
                 backoff: float = 0.5, batch_size: int = 0, tokenizer_fingerprint: Optional[str] = None,
                 sleep=time.sleep):
        self.urls = list(urls)  # base URLs without a trailing '/' (PPOArguments.reward_server_urls)
        if not self.urls:
            raise ValueError(f"key {self.url_key!r}: no URL given")
        self.timeout, self.retries, self.backoff, self.batch_size = timeout, retries, backoff, batch_size
        self.fingerprint, self.sleep = tokenizer_fingerprint, sleep
        token = token or os.environ.get(self.token_variable)
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.http = httpx.Client(timeout=timeout, headers=headers, trust_env=False)
        logging.getLogger("httpx").setLevel(logging.WARNING)  # not a log line per request (steps log the time)
        self.turn = 0  # rotates the first URL of each request over the URLs
        self.down_until: Dict[str, float] = {}
        self.lock = threading.Lock()

    @classmethod
    def from_args(cls, ppo_args, tokenizer=None) -> "RewardServerClient":
        """The client PPO's arguments describe; checks that a server answers before any model is loaded."""
        client = cls(ppo_args.reward_server_urls, ppo_args.reward_server_token, ppo_args.reward_server_timeout,
                     ppo_args.reward_server_retries, ppo_args.reward_server_backoff,
                     ppo_args.reward_server_batch_size,
                     tokenizer_fingerprint(tokenizer) if tokenizer is not None else None)
        url, health = client.health()
        client.health_report = {"url": url, **health}  # what the rollout ledger records of the server
        if health.get("token_ok") is False:
            raise RewardServerError(f"reward server {url}: missing or wrong bearer token (key 'reward_server_token' "
                                    "or REWARD_SERVER_TOKEN)")
        print(f"reward server {url}: model {health.get('model')}, judges {health.get('judges')}, "
              f"device {health.get('device')}")
        return client

    def order(self, first: int) -> List[str]:
        """The URLs starting at index `first`, those that failed in the last DOWN_FOR seconds last."""
        rotated = self.urls[first % len(self.urls):] + self.urls[: first % len(self.urls)]
        now = time.monotonic()
        return sorted(rotated, key=lambda url: self.down_until.get(url, 0.0) > now)

    def call(self, method: str, path: str, first: int, body=None, rows: int = 0,
             parse: Optional[Callable] = None) -> Tuple[object, str, int]:
        """(parsed answer, URL that gave it, retries made): one request with retries and fail-over. parse(response,
        url) reads a POST's 200 answer (default: `rows` scores); its Retry is retried, its RewardServerError not."""
        urls, errors, wait, start = self.order(first), {}, 0.0, time.monotonic()
        for attempt in range(self.retries + 1):
            url = urls[attempt % len(urls)]
            if attempt and attempt % len(urls) == 0:  # every URL failed once more: back off before the next round
                delay = max(wait, min(MAX_BACKOFF, self.backoff * 2 ** (attempt // len(urls) - 1)))
                print(f"{self.what}: {'; '.join(f'{u}: {e}' for u, e in errors.items())}; retry {attempt} of "
                      f"{self.retries} in {delay:g} s", file=sys.stderr, flush=True)
                self.sleep(delay)
                wait = 0.0
            try:
                response = self.http.request(method, url + path, json=body)
                if method == "GET" and response.status_code in (404, 405):  # no /health (PaddleNLP's): still up
                    return {}, url, attempt
                if response.status_code in RETRYABLE_STATUS:
                    raise Retry(f"HTTP {response.status_code}: {error_message(response)}",
                                 retry_after_seconds(response))
                if response.status_code != 200:
                    raise RewardServerError(f"{self.what} {url}: HTTP {response.status_code}: "
                                            f"{error_message(response)}")
                if method == "POST":
                    answer = parse(response, url) if parse is not None else parse_scores(response, url, rows)
                else:
                    answer = response.json()
                return answer, url, attempt
            except httpx.TimeoutException:
                errors[url] = f"no answer within {self.timeout:g} s ({self.timeout_key})"
            except httpx.TransportError as err:
                errors[url] = one_line(f"{type(err).__name__}: {err}")
            except Retry as err:
                errors[url], wait = str(err), max(wait, err.retry_after)
            except RewardServerError:
                raise
            except ValueError as err:  # a health answer that is not JSON
                raise RewardServerError(f"{self.what} {url}{path}: the response is not JSON") from err
            with self.lock:
                self.down_until[url] = time.monotonic() + DOWN_FOR
        state = "failing" if any(e.startswith(("HTTP", "error_code")) for e in errors.values()) else "unreachable"
        raise RewardServerError(
            f"{self.what} {state} after {self.retries + 1} attempts in {time.monotonic() - start:.1f} s "
            f"({self.retries_key}): " + "; ".join(f"{url}: {error}" for url, error in errors.items()))

    def health(self) -> Tuple[str, dict]:
        answer, url, _ = self.call("GET", "/health", 0)
        return url, answer if isinstance(answer, dict) else {}

    def scores(self, prompts: Sequence, completions: Sequence[str], answers: Optional[Sequence] = None,
               input_ids: Optional[np.ndarray] = None, attention_mask: Optional[np.ndarray] = None
               ) -> Tuple[np.ndarray, int]:
        """(scores [N] float64, retries made). input_ids / attention_mask [N, W]: the rollout's padded tokens,
        scored as they are when the server's tokenizer is the actor's."""
        n = len(completions)
        if n == 0:
            return np.zeros([0], "float64"), 0
        answers = list(answers) if answers is not None else [None] * n
        size = self.batch_size or n
        chunks = [(start, min(start + size, n)) for start in range(0, n, size)]

        def body(start, end) -> dict:
            out = {"src": list(prompts[start:end]), "tgt": answers[start:end], "response": list(completions[start:end])}
            if input_ids is not None and self.fingerprint is not None:
                out.update(input_ids=np.asarray(input_ids)[start:end].tolist(),
                           attention_mask=np.asarray(attention_mask)[start:end].tolist(), tokenizer=self.fingerprint)
            return out

        with self.lock:
            first, self.turn = self.turn, self.turn + 1
        jobs = [(i, body(start, end), end - start) for i, (start, end) in enumerate(chunks)]
        if len(jobs) == 1:
            results = [self.call("POST", "/", first, jobs[0][1], jobs[0][2])]
        else:  # chunks go out together, each starting at another URL
            with ThreadPoolExecutor(max_workers=min(len(jobs), 4 * len(self.urls))) as pool:
                results = list(pool.map(lambda job: self.call("POST", "/", first + job[0], job[1], job[2]), jobs))
        scores = np.asarray([s for answer, _, _ in results for s in answer], dtype="float64")  # [N]
        return scores, sum(retries for _, _, retries in results)

    def close(self) -> None:
        self.http.close()
