"""The reward server's web app (FastAPI): micro-batching, a bounded queue, metrics (requests: server_requests.py).

    POST /            PaddleNLP: {"src": [...], "tgt": [...], "response": [...]} -> {"error_code": 0,
                      "error_msg": "Success", "score": [...]}; our client adds "input_ids", "attention_mask"
                      (its padded rollout tensors) and "tokenizer" (its fingerprint): with the server's own
                      fingerprint the model scores exactly those tensors, in a forward pass of their own
    POST /get_reward  OpenRLHF: {"query": [...], "prompts": [...], "labels": [...]} -> {"rewards", "scores",
                      "extra_logs"}; the model reads each query as it stands, judges see the query minus its prompt
    GET  /health      model, judges, device, queue depth, whether the request's token is right (no token needed)
    GET  /metrics     requests, responses by status, rows, batches, latency percentiles

Requests wait in a bounded queue (503 + Retry-After when full); one worker thread scores them, merging the rows of
waiting requests into one forward pass (up to max_batch rows, waiting max_wait_ms for more). Bad requests get 4xx
with a one-line message naming the field; a score that cannot be computed (NaN, a judge raising) 422, other
failures 500.
"""
from __future__ import annotations

import asyncio
import collections
import hmac
import math
import time
import traceback
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Dict, List, Optional

import numpy as np
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from alignment.fileio import write_text_atomic
from alignment.rewards.server_requests import (HTTPProblem, ServerLimits, Work, openrlhf_work, paddlenlp_work,
                                               read_json)


# --- micro-batching ------------------------------------------------------------------------------------------------
class MicroBatcher:
    """A bounded queue of Work and one worker thread that scores it: the rows of requests waiting together
    go through one scorer call (a request with its own layout goes through one of its own)."""

    def __init__(self, scorer, limits: ServerLimits, metrics: "Metrics"):
        self.scorer, self.limits, self.metrics = scorer, limits, metrics
        self.queue: Optional[asyncio.Queue] = None
        self.pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="scorer")
        self.task = None
        self.last_batch_seconds = 0.0

    def start(self) -> None:
        self.queue = asyncio.Queue(maxsize=self.limits.max_queue)
        self.task = asyncio.get_running_loop().create_task(self.run())

    async def stop(self) -> None:
        if self.task is not None:
            self.task.cancel()
        self.pool.shutdown(wait=False, cancel_futures=True)

    def depth(self) -> int:
        return self.queue.qsize() if self.queue is not None else 0

    async def submit(self, work: Work):
        work.future = asyncio.get_running_loop().create_future()
        try:
            self.queue.put_nowait(work)
        except asyncio.QueueFull:
            self.metrics.rejected += 1
            raise HTTPProblem(503, f"queue full ({self.limits.max_queue} requests waiting); retry later") from None
        return await work.future

    async def collect(self) -> List[Work]:
        """The next batch: the first waiting request, plus those arriving within max_wait_ms, up to max_batch rows."""
        batch = [await self.queue.get()]
        if not self.limits.batching:
            return batch
        rows, deadline = len(batch[0].rows), time.monotonic() + self.limits.max_wait_ms / 1000
        while rows < self.limits.max_batch:
            try:
                work = self.queue.get_nowait()
            except asyncio.QueueEmpty:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                try:
                    work = await asyncio.wait_for(self.queue.get(), left)
                except asyncio.TimeoutError:
                    break
            batch.append(work)
            rows += len(work.rows)
        return batch

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            batch = await self.collect()
            start = time.monotonic()
            try:
                results = await loop.run_in_executor(self.pool, self.score, batch)
            except Exception as err:  # noqa: BLE001 - the worker must outlive any one batch
                results = [err] * len(batch)
            self.last_batch_seconds = time.monotonic() - start
            for work, result in zip(batch, results):
                if not work.future.done():  # the client may have gone away
                    work.future.set_result(result)

    def score(self, batch: List[Work]) -> list:
        """One result per Work: (total [n], parts) or the exception that scoring it raised."""
        merged = [w for w in batch if w.layout is None]
        groups = [[w] for w in batch if w.layout is not None] + ([merged] if merged else [])
        results = {}
        for group in groups:
            self.metrics.batches += 1
            self.metrics.batch_rows += sum(len(w.rows) for w in group)
            try:
                total, parts = self.scorer.score([r for w in group for r in w.rows], group[0].layout)
            except Exception as err:  # noqa: BLE001 - reported to each request of the group
                if len(group) > 1:  # find the culprit: score the requests one by one
                    results.update({id(w): self.score([w])[0] for w in group})
                    continue
                results[id(group[0])] = err
                continue
            start = 0
            for work in group:
                end = start + len(work.rows)
                results[id(work)] = (total[start:end], {k: v[start:end] for k, v in parts.items()})
                start = end
        return [results[id(w)] for w in batch]


# --- metrics -------------------------------------------------------------------------------------------------------
class Metrics:
    def __init__(self):
        self.started = time.time()
        self.requests: Dict[str, int] = collections.Counter()
        self.responses: Dict[str, int] = collections.Counter()
        self.latencies = collections.deque(maxlen=4096)  # seconds of recent scoring requests
        self.rows = self.batches = self.batch_rows = self.rejected = 0

    def record(self, endpoint: str, status: int, seconds: float, rows: int) -> None:
        self.requests[endpoint] += 1
        self.responses[str(status)] += 1
        if status == 200:
            self.latencies.append(seconds)
            self.rows += rows

    def snapshot(self, depth: int) -> dict:
        recent = np.asarray(self.latencies) * 1000
        percentiles = {f"p{q}": float(np.percentile(recent, q)) if recent.size else None for q in (50, 90, 99)}
        return {"requests": dict(self.requests), "responses": dict(self.responses), "rows": self.rows,
                "batches": self.batches, "mean_batch_rows": self.batch_rows / self.batches if self.batches else None,
                "rejected_queue_full": self.rejected, "queue_depth": depth,
                "latency_ms": {**percentiles, "max": float(recent.max()) if recent.size else None,
                               "count": int(recent.size)},
                "uptime_s": time.time() - self.started}


# --- the app -------------------------------------------------------------------------------------------------------
def error_response(status: int, message: str, retry_after: Optional[float] = None) -> JSONResponse:
    message = " ".join(str(message).split())[:1000]  # one line, whatever raised it
    headers = {"Retry-After": str(max(1, math.ceil(retry_after)))} if retry_after is not None else {}
    if status == 401:
        headers["WWW-Authenticate"] = "Bearer"
    return JSONResponse({"error_code": status, "error_msg": message, "detail": message}, status, headers=headers)


def create_app(scorer, limits: ServerLimits, info: dict, on_ready: Optional[Callable[[], None]] = None) -> FastAPI:
    """The app serving `scorer` (alignment.rewards.scoring.ServerScorer or anything with its score()); on_ready runs
    once the server has started."""
    metrics = Metrics()
    batcher = MicroBatcher(scorer, limits, metrics)

    async def lifespan(app):
        batcher.start()
        if on_ready is not None:
            on_ready()
        yield
        await batcher.stop()

    app = FastAPI(title="alignment reward server", lifespan=lifespan)
    app.state.metrics, app.state.batcher = metrics, batcher

    def authorised(request: Request) -> bool:
        if not limits.token:
            return True
        given = request.headers.get("authorization", "")
        return hmac.compare_digest(given.encode(), f"Bearer {limits.token}".encode())

    async def scored(request: Request, endpoint: str, parse, answer):
        start, rows, status = time.monotonic(), 0, 200
        try:
            if not authorised(request):
                raise HTTPProblem(401, "missing or wrong bearer token (header 'Authorization: Bearer <token>')")
            work = parse(await read_json(request, limits.max_body_bytes))
            rows = len(work.rows)
            result = await batcher.submit(work)
            if isinstance(result, Exception):  # a ValueError (non-finite score, a judge's error) recurs: 422
                raise HTTPProblem(422 if isinstance(result, ValueError) else 500,
                                  f"scoring failed: {type(result).__name__}: {result}")
            return JSONResponse(answer(*result))
        except HTTPProblem as err:
            status = err.status
            retry = max(1.0, batcher.last_batch_seconds) if status == 503 else None
            return error_response(status, str(err), retry)
        except Exception as err:  # noqa: BLE001 - a bug of ours: answer 500 with the reason, keep serving
            status = 500
            traceback.print_exc()
            return error_response(500, f"{type(err).__name__}: {err}")
        finally:
            metrics.record(endpoint, status, time.monotonic() - start, rows)

    @app.post("/")
    async def paddlenlp(request: Request):
        return await scored(request, "/", lambda body: paddlenlp_work(body, limits, scorer.fingerprint,
                                                                      scorer.vocab_size, scorer.max_positions),
                            lambda total, parts: {"error_code": 0, "error_msg": "Success", "score": total.tolist()})

    @app.post("/get_reward")
    async def openrlhf(request: Request):
        return await scored(request, "/get_reward", lambda body: openrlhf_work(body, limits),
                            lambda total, parts: {"rewards": total.tolist(), "scores": total.tolist(),
                                                  "extra_logs": {k: v.tolist() for k, v in parts.items()}})

    @app.get("/health")
    async def health(request: Request):
        return {"status": "ok", **info, "queue_depth": batcher.depth(), "max_queue": limits.max_queue,
                "tokenizer": scorer.fingerprint, "token_ok": authorised(request)}

    @app.get("/metrics")
    async def metrics_view(request: Request):
        if not authorised(request):
            return error_response(401, "missing or wrong bearer token (header 'Authorization: Bearer <token>')")
        return metrics.snapshot(batcher.depth())

    return app


# --- start-up ------------------------------------------------------------------------------------------------------
def load_scorer(model_dir: Optional[str], judges=(), weights=(), max_batch: int = 32):
    """A ServerScorer for a score-model checkpoint (with its normalizer and tokenizer) and/or judges."""
    from alignment.models import Tokenizer
    from alignment.models.score_model import ScoreModel
    from alignment.rewards.scoring import ServerScorer

    model = tokenizer = None
    if model_dir:
        model, tokenizer = ScoreModel.from_pretrained(model_dir), Tokenizer.from_pretrained(model_dir)
        for param in model.parameters():
            param.stop_gradient = True
    return ServerScorer(model, tokenizer, judges, weights, max_batch)


def serve(scorer, limits: ServerLimits, info: dict, host: str, port: int, port_file: Optional[str] = None) -> None:
    """Bind host:port (0 = any free port), announce the address (stdout, and port_file when given), serve."""
    import socket

    import uvicorn

    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)  # asyncio sets TCP_NODELAY only then
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # a restart may reuse the port of a killed server
    try:
        sock.bind((host, port))
    except (OSError, OverflowError) as err:  # a busy port, an address this machine does not have
        sock.close()
        raise ValueError(f"--host {host} --port {port}: cannot listen there "
                         f"({getattr(err, 'strerror', None) or err})") from None
    sock.listen(2048)
    bound = sock.getsockname()[1]
    print(f"reward server listening on http://{host}:{bound} (model {info.get('model')}, judges "
          f"{info.get('judges')}; max batch {limits.max_batch} rows, queue {limits.max_queue})", flush=True)
    # the port file appears once uvicorn serves (and handles signals): a signal before it would leave its
    # coroutine unawaited, with a warning on stderr. A port file that cannot be written stops the server (clients
    # wait on that file), with one line rather than uvicorn's logged traceback.
    failed = []

    def announce() -> None:
        try:
            write_text_atomic(port_file, str(bound))
        except OSError as err:
            failed.append(err)
            server.should_exit = True

    app = create_app(scorer, limits, info, announce if port_file else None)
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", access_log=False))
    server.run(sockets=[sock])
    if failed:
        raise OSError(f"--port-file {port_file}: cannot write it ({failed[0].strerror or failed[0]}); stopped")
