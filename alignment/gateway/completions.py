"""OpenAI's legacy completions (`POST /v1/completions`) as vLLM serves them, for programs that score or continue
raw token sequences: a served distillation teacher asks for the log-probs of a student's tokens with
{"prompt": [[ids], ...], "echo": true, "max_tokens": 1, "logprobs": k, "return_tokens_as_token_ids": true}.

Each prompt (token ids, or text encoded without a chat template) gives a choice: with `echo` its own tokens first,
scored by one forward pass (`token_logprobs`, null for the first token; `top_logprobs`, the k most likely tokens
at each position and the token itself), then `max_tokens` new tokens sampled by the decode engine."""
from __future__ import annotations

import dataclasses
import time
from typing import List, Optional

import numpy as np
import paddle

from alignment.gateway.protocol import GatewayError, Limits, number
from alignment.models.engine import DecodeSequence
from alignment.models.logprobs import gather_log_probs, top_log_probs
from alignment.models.multi_lora import routed

MAX_LOGPROBS = 20


@dataclasses.dataclass(frozen=True)
class CompletionRequest:
    prompts: tuple  # per prompt: a tuple of token ids, or a str
    max_tokens: int = 16
    echo: bool = False
    logprobs: Optional[int] = None
    temperature: Optional[float] = None
    top_p: Optional[float] = None
    n: int = 1
    seed: Optional[int] = None
    stop: tuple = ()
    token_ids: bool = False  # return_tokens_as_token_ids: tokens named "token_id:<id>"
    model: str = ""

    @property
    def tools(self) -> tuple:  # what the chat path reads of a request
        return ()


def parse_completion_request(body, limits: Limits = Limits(), vocab: int = 1 << 31) -> CompletionRequest:
    """The body of POST /v1/completions, checked; a GatewayError (400, naming the parameter) otherwise."""
    if not isinstance(body, dict):
        raise GatewayError(400, "the body must be a JSON object")
    prompt = body.get("prompt")
    if isinstance(prompt, str) or (isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt)):
        prompt = [prompt]
    if not isinstance(prompt, list) or not prompt or len(prompt) > limits.max_messages or not all(
            (isinstance(p, str) and p) or (isinstance(p, list) and p and all(
                isinstance(t, int) and not isinstance(t, bool) and 0 <= t < vocab for t in p)) for p in prompt):
        raise GatewayError(400, f"'prompt' must be a non-empty string, a list of token ids below {vocab}, or a list "
                                f"of at most {limits.max_messages} of either", "prompt")
    if sum(len(p) for p in prompt) > limits.max_chars:
        raise GatewayError(413, f"the prompts hold more than {limits.max_chars} tokens or characters", "prompt")
    stop = body.get("stop") or []
    stop = [stop] if isinstance(stop, str) else stop
    if not isinstance(stop, list) or len(stop) > 4 or not all(isinstance(s, str) and s for s in stop):
        raise GatewayError(400, "'stop' must be a string or a list of at most 4 non-empty strings", "stop")
    max_tokens = number(body, "max_tokens", 0, 1 << 20, True)
    if body.get("stream"):
        raise GatewayError(400, "'stream' is not served; set it to false", "stream")
    return CompletionRequest(tuple(p if isinstance(p, str) else tuple(p) for p in prompt),
                             16 if max_tokens is None else max_tokens, bool(body.get("echo")),
                             number(body, "logprobs", 0, MAX_LOGPROBS, True), number(body, "temperature", 0.0, 2.0),
                             number(body, "top_p", 0.0, 1.0), number(body, "n", 1, limits.max_n, True) or 1,
                             number(body, "seed", -(1 << 63), (1 << 63) - 1, True), tuple(stop),
                             bool(body.get("return_tokens_as_token_ids")), str(body.get("model", "")))


@paddle.no_grad()
def score_prompt(model, ids: List[int], k: int):
    """(log-prob of each token given the ones before [L - 1], top-k (log-probs, ids) [L - 1, k] or None) of one
    forward pass over `ids`."""
    logits = model(paddle.to_tensor([ids], dtype="int64")).logits[0, :-1]  # [L - 1, vocab]: predicts ids[1:]
    token = gather_log_probs(logits.unsqueeze(0), paddle.to_tensor([ids[1:]], dtype="int64"))[0]  # [L - 1]
    top = None if not k else tuple(t.numpy() for t in top_log_probs(logits, k))
    return token.numpy(), top


def logprobs_block(tokenizer, ids: List[int], token_lps: List[Optional[float]], tops: List[Optional[list]],
                   as_ids: bool) -> dict:
    """The choice's `logprobs`: tokens, token_logprobs, top_logprobs (a {token: log-prob} map per position, the
    token's own added as vLLM does), text_offset."""
    def name(t: int) -> str:
        return f"token_id:{t}" if as_ids else tokenizer.decode([t], skip_special_tokens=False)

    tokens = [name(t) for t in ids]
    offsets, at = [], 0
    for t in ids:
        offsets.append(at)
        at += len(tokenizer.decode([t], skip_special_tokens=False))
    top_maps = []
    for t, lp, top in zip(ids, token_lps, tops):
        if top is None:
            top_maps.append(None)
            continue
        entry = {name(i): v for i, v in top}
        entry.setdefault(name(t), lp)
        top_maps.append(entry)
    return {"tokens": tokens, "token_logprobs": token_lps, "top_logprobs": top_maps, "text_offset": offsets}


def slots_needed(request: CompletionRequest) -> int:
    return len(request.prompts) * request.n if request.max_tokens else 0


def prompt_ids(gateway, prompt) -> List[int]:
    """A prompt's token ids: as given, or its text encoded as a tokenizer does (special tokens added)."""
    return list(prompt) if not isinstance(prompt, str) else gateway.tokenizer.encode(prompt, add_special_tokens=True)


def start(gateway, call, config, temperature: float) -> list:
    """The call's sequences in the engine (none when it asks for no new tokens), choices prompt by prompt."""
    request, seqs = call.request, []
    call.prompt_ids = [prompt_ids(gateway, p) for p in request.prompts]
    room = gateway.capacity - (request.max_tokens or 0)
    if any(len(ids) > room for ids in call.prompt_ids):
        raise GatewayError(400, f"a prompt and max_tokens exceed the {gateway.capacity} tokens a sequence may hold",
                           "prompt", "context_length_exceeded")
    if not request.max_tokens:
        return []
    stop = (lambda turn: gateway._stopped(turn, request.stop)) if request.stop else None
    for index, ids in enumerate(call.prompt_ids):
        for choice in range(request.n):
            rng = None if request.seed is None else np.random.default_rng([request.seed, index, choice])
            seq = DecodeSequence(ids, config, len(ids) + request.max_tokens, rng=rng, stop=stop,
                           log_prob_temperature=temperature, top_logprobs=request.logprobs or 0, adapter=call.adapter)
            gateway.engine.add(seq)
            seqs.append(seq)
    return seqs


def respond(gateway, call) -> dict:
    request, tokenizer = call.request, gateway.tokenizer
    choices, generated = [], iter(call.seqs)
    for index, ids in enumerate(call.prompt_ids):
        echoed = None
        if request.echo:
            with routed(gateway.engine.model, [call.adapter]):
                token_lps, top = score_prompt(gateway.engine.model, ids, request.logprobs or 0)
            tops = [None] + ([list(zip(top[1][i].tolist(), top[0][i].tolist())) for i in range(len(ids) - 1)]
                             if top is not None else [None] * (len(ids) - 1))
            echoed = (list(ids), [None] + token_lps.tolist(), tops)
        for _ in range(request.n):
            seq = next(generated) if request.max_tokens else None
            new = list(seq.turn) if seq is not None else []
            text = tokenizer.decode(new, skip_special_tokens=False)
            for stop in request.stop:
                text = text[: text.index(stop)] if stop in text else text
            tokens, lps, tops = echoed if echoed is not None else ([], [], [])
            tokens, lps = tokens + new, lps + (list(seq.turn_log_probs) if seq is not None else [])
            tops = tops + ([list(t) for t in seq.turn_top] if seq is not None and seq.turn_top else [None] * len(new))
            choice = {"index": len(choices), "text": (tokenizer.decode(ids, skip_special_tokens=False)
                                                      if request.echo else "") + text,
                      "finish_reason": "length" if seq is None or seq.ending in ("length", "budget") else "stop",
                      "logprobs": logprobs_block(tokenizer, tokens, lps, tops, request.token_ids)
                      if request.logprobs is not None else None}
            choices.append(choice)
    prompt = sum(len(ids) for ids in call.prompt_ids)
    completion = sum(len(s.turn) for s in call.seqs)
    return {"id": f"cmpl-{call.session.id}", "object": "text_completion", "created": int(time.time()),
            "model": call.model, "choices": choices,
            "usage": {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}}
