"""The gateway over HTTP (FastAPI + uvicorn): every registered route (route.py: OpenAI chat completions and
Responses, Anthropic Messages; each streamed or not: a streamed call's events go out as its turn is decoded,
streaming.py) and the model list, for a whole server (`/v1/...`) and for one
training episode's session (`/sessions/<id>/v1/...`, the base URL its agent gets).

Every request needs the key when the gateway has one (a training run always makes one), as `Authorization: Bearer
<key>` or as Anthropic's `x-api-key: <key>`; bodies above the size limit get 413; every error, malformed requests
included, takes the route's error shape (OpenAI's error object but on the Anthropic route). The server listens on
127.0.0.1 unless told otherwise, on a port bound before it starts (0: any free one)."""
from __future__ import annotations

import asyncio
import hmac
import socket
import threading
import time
from typing import Optional

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, StreamingResponse
from starlette.exceptions import HTTPException

from alignment.gateway import anthropic_messages, chat_completions, responses  # noqa: F401 (the routes register)
from alignment.gateway import streaming
from alignment.gateway.completions import parse_completion_request
from alignment.gateway.protocol import GatewayError, Limits
from alignment.gateway.route import ROUTES, Route
from alignment.rewards.server_requests import HTTPProblem, read_json


def create_app(gateway, key: Optional[str], limits: Limits = Limits()) -> FastAPI:
    app = FastAPI(title="alignment gateway", docs_url=None, redoc_url=None, openapi_url=None)

    def check_key(request: Request) -> None:
        if key and not (hmac.compare_digest(request.headers.get("authorization", "").encode(),
                                            f"Bearer {key}".encode()) or
                        hmac.compare_digest(request.headers.get("x-api-key", "").encode(), key.encode())):
            raise GatewayError(401, "missing or wrong API key (header 'Authorization: Bearer <key>' or "
                                    "'x-api-key: <key>')", code="invalid_api_key")

    async def body_of(request: Request):
        check_key(request)
        try:
            return await read_json(request, limits.max_body_bytes)
        except HTTPProblem as err:
            raise GatewayError(err.status, str(err)) from None

    async def answer(route: Route, request: Request, session: Optional[str]):
        feed = None
        try:
            parsed = route.parse(await body_of(request), limits)
            if parsed.stream:  # answered once the call starts: an error before that is the call's status
                feed = streaming.Feed(asyncio.get_running_loop())
                gateway.submit(session, parsed, feed)
                head = await feed.get()
            else:
                outcome = await asyncio.wrap_future(gateway.submit(session, parsed))
        except GatewayError as err:
            return JSONResponse(route.error(err), err.status)
        except BaseException:  # cancelled while the call starts
            if feed is not None:
                gateway.cancel(feed)
            raise
        if feed is None:
            return JSONResponse(route.response(outcome, parsed))
        return StreamingResponse(events(route, route.writer(parsed), head, feed), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache"})

    async def events(route: Route, writer: streaming.Writer, head, feed: streaming.Feed):
        """The stream's events as the call's items come; a client gone before the end cancels the call (Starlette
        cancels this generator when the connection drops)."""
        try:
            for text in writer.start(head):
                yield text
            while not feed.over:
                try:
                    item = await feed.get()
                except GatewayError as err:  # the session closed under the call
                    yield streaming.event(route.error(err), "error")
                    return
                for text in writer.write(item):
                    yield text
        finally:
            if not feed.over:
                gateway.cancel(feed)

    def serve(route: Route) -> None:
        async def whole_server(request: Request):
            return await answer(route, request, None)

        async def one_session(session: str, request: Request):
            return await answer(route, request, session)

        app.post(f"/v1/{route.PATH}")(whole_server)
        app.post(f"/sessions/{{session}}/v1/{route.PATH}")(one_session)

    def models(request: Request) -> dict:
        check_key(request)
        return {"object": "list", "data": [{"id": name, "object": "model", "created": int(time.time()),
                                            "owned_by": "alignment"} for name in gateway.model_names()]}

    for route in ROUTES.values():
        serve(route)

    @app.post("/v1/completions")
    async def completion(request: Request):
        parsed = parse_completion_request(await body_of(request), limits, gateway.vocab_size)
        return await asyncio.wrap_future(gateway.submit_completion(parsed))

    @app.get("/v1/models")
    async def model_list(request: Request):
        return models(request)

    @app.get("/sessions/{session}/v1/models")
    async def session_models(session: str, request: Request):
        return models(request)

    @app.exception_handler(GatewayError)
    async def refused(request: Request, err: GatewayError):
        return JSONResponse(err.body(), err.status)

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, err: HTTPException):
        kind = "not_found_error" if err.status_code == 404 else "invalid_request_error"
        return JSONResponse(GatewayError(err.status_code, str(err.detail), kind=kind).body(), err.status_code)

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, err: RequestValidationError):
        return JSONResponse(GatewayError(400, str(err)).body(), 400)

    return app


class GatewayServer:
    """uvicorn serving `app` in a daemon thread on host:port (0: a free port), bound before the thread starts so
    the address is known at once (`base_url`)."""

    def __init__(self, app: FastAPI, host: str = "127.0.0.1", port: int = 0):
        import uvicorn

        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self.socket = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        self.socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            self.socket.bind((host, port))
        except (OSError, OverflowError) as err:
            self.socket.close()
            raise ValueError(f"gateway: cannot listen on {host}:{port} "
                             f"({getattr(err, 'strerror', None) or err})") from None
        self.socket.listen(1024)
        self.host, self.port = host, self.socket.getsockname()[1]
        self.server = uvicorn.Server(uvicorn.Config(app, log_level="warning", access_log=False))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.socket]},
                                       name="alignment-gateway", daemon=True)
        self.thread.start()
        while not self.server.started and self.thread.is_alive():
            time.sleep(0.005)

    @property
    def base_url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)
