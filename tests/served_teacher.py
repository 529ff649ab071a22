"""A small OpenAI-compatible server for the tests: `POST /v1/completions` with token-id prompts, echo and logprobs,
answered as vLLM answers it (`return_tokens_as_token_ids`: top log-prob keys "token_id:<id>", the echoed token's own
log-prob added to its position's top-k), and `POST /v1/chat/completions`, both computed by one of our own models
(real forward passes: the numbers of the local model). `GET /v1/models` lists it. Runs in a thread (uvicorn)."""
from __future__ import annotations

import socket
import threading
import time
from typing import Callable, List, Optional, Union

import numpy as np
import paddle
import uvicorn
from fastapi import FastAPI, HTTPException
from pydantic import BaseModel


class CompletionRequest(BaseModel):
    model: str
    prompt: Union[List[List[int]], List[int]]
    echo: bool = False
    max_tokens: int = 16
    logprobs: Optional[int] = None
    temperature: float = 1.0
    return_tokens_as_token_ids: bool = False


class ChatRequest(BaseModel):
    model: str
    messages: list
    max_tokens: int = 16
    temperature: float = 1.0
    logprobs: bool = False
    top_logprobs: int = 0


def log_softmax_rows(model, ids: List[int]) -> np.ndarray:
    with paddle.no_grad():
        logits = model(paddle.to_tensor([ids], dtype="int64")).logits[0].astype("float64")  # [L, V]
        return paddle.nn.functional.log_softmax(logits, axis=-1).numpy()


def completion_choice(model, ids: List[int], k: int, index: int) -> dict:
    rows = log_softmax_rows(model, ids)  # rows[j] predicts token j + 1
    generated = int(rows[-1].argmax())
    tokens = ids + [generated]
    token_logprobs, top = [None], [None]
    for j in range(1, len(tokens)):
        order = np.argsort(-rows[j - 1])[:k]
        entry = {f"token_id:{int(t)}": float(rows[j - 1][t]) for t in order}
        entry[f"token_id:{tokens[j]}"] = float(rows[j - 1][tokens[j]])  # vLLM adds the echoed token's own
        token_logprobs.append(float(rows[j - 1][tokens[j]]))
        top.append(entry)
    return {"index": index, "text": "", "finish_reason": "length",
            "logprobs": {"tokens": [f"token_id:{t}" for t in tokens], "token_logprobs": token_logprobs,
                         "top_logprobs": top, "text_offset": list(range(len(tokens)))}}


def make_app(model=None, name: str = "teacher", chat: Optional[Callable] = None, fail_first: int = 0) -> FastAPI:
    """chat(messages, max_tokens) -> (text, [(token, log-prob)] or None) answers /v1/chat/completions; fail_first: that many requests get 503."""
    app, state = FastAPI(), {"requests": 0}

    def count():
        state["requests"] += 1
        if state["requests"] <= fail_first:
            raise HTTPException(503, "warming up")

    @app.get("/v1/models")
    def models():
        return {"object": "list", "data": [{"id": name, "object": "model"}]}

    @app.post("/v1/completions")
    def completions(request: CompletionRequest):
        count()
        if request.model != name:
            raise HTTPException(404, f"model {request.model} not found")
        prompts = request.prompt if request.prompt and isinstance(request.prompt[0], list) else [request.prompt]
        return {"object": "text_completion", "model": name,
                "choices": [completion_choice(model, list(p), request.logprobs or 0, i) for i, p in enumerate(prompts)]}

    @app.post("/v1/chat/completions")
    def chat_completions(request: ChatRequest):
        count()
        text, top = chat(request.messages, request.max_tokens)
        logprobs = {"content": [{"token": "x", "logprob": 0.0, "top_logprobs": [
            {"token": t, "logprob": v} for t, v in top]}]} if request.logprobs and top else None
        return {"object": "chat.completion", "model": name, "choices": [
            {"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": logprobs,
             "finish_reason": "stop"}]}

    app.state.counter = state
    return app


class Served:
    """`with Served(app) as url:` - the app on 127.0.0.1 at a free port; url is its /v1 base."""

    def __init__(self, app):
        self.app = app

    def __enter__(self) -> str:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        self.server = uvicorn.Server(uvicorn.Config(self.app, host="127.0.0.1", port=port, log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started and time.monotonic() < deadline:
            time.sleep(0.02)
        return f"http://127.0.0.1:{port}/v1"

    def __exit__(self, *exc):
        self.server.should_exit = True
        self.thread.join(timeout=10)
