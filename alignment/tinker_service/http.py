"""The HTTP side of the Tinker-compatible server: the routes the `tinker` SDK (0.38) calls, on the standard
library's threaded HTTP server, every request checked for the SDK's `X-API-Key` header.

    POST /api/v1/client/config, /client/dynamic_config   feature flags: API-key auth (no JWT exchange), httpx
                                                         transport, fwd/bwd bodies uncompressed and sent in order
    POST /api/v1/create_session, /session_heartbeat, /telemetry, /sessions/<id>/finish, /cancel_future
    POST /api/v1/create_model, /get_info, /forward_backward (protobuf body), /optim_step, /save_weights,
         /load_weights, /save_weights_for_sampler, /create_sampling_session, /asample, /retrieve_future
    GET  /api/v1/healthz, /get_server_capabilities, /samplers/<id>

JSON bodies in and out, except forward_backward's request and the ForwardBackwardOutput / SampleResponse results,
which are protobuf (wire.py). A bad key is 401; a malformed body 400 with {"error": ...}.
"""
from __future__ import annotations

import hmac
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Callable, Dict, Optional

from alignment.tinker_service.service import TinkerService
from alignment.tinker_service.training import UserError
from alignment.tinker_service.wire import WireError

PROTO = "application/x-protobuf"
MAX_BODY = 256 * 1024 * 1024
CLIENT_CONFIG = {"pjwt_auth_enabled": False, "credential_default_source": "api_key", "use_pyqwest_transport": False,
                 "proto_compress_fwdbwd": False, "parallel_fwdbwd_chunks": False, "sample_use_retrieve_futures": False,
                 "custom_loss_server_side": False, "sample_join_sampling_session": False}


def json_routes(service: TinkerService) -> Dict[str, Callable[[dict], dict]]:
    """POST path -> handler of its JSON body."""
    return {
        "/api/v1/client/config": lambda r: CLIENT_CONFIG,
        "/api/v1/client/dynamic_config": lambda r: {},
        "/api/v1/create_session": lambda r: {"type": "create_session", "session_id": service.create_session()},
        "/api/v1/session_heartbeat": lambda r: {"type": "session_heartbeat"},
        "/api/v1/telemetry": lambda r: {"status": "accepted"},
        "/api/v1/cancel_future": lambda r: {},
        "/api/v1/create_model": service.create_model,
        "/api/v1/get_info": lambda r: service.info(r["model_id"]),
        "/api/v1/optim_step": service.optim_step,
        "/api/v1/save_weights": service.save_weights,
        "/api/v1/load_weights": service.load_weights,
        "/api/v1/save_weights_for_sampler": service.save_for_sampler,
        "/api/v1/create_sampling_session": lambda r: {"type": "create_sampling_session",
                                                      "sampling_session_id": service.create_sampling_session(r)},
        "/api/v1/asample": service.sample,
    }


def capabilities(service: TinkerService) -> dict:
    return {"supported_models": [{"model_name": b.name, "max_context_length": b.max_length, "trainable": True,
                                  "sampleable": True} for b in service.bases.values()]}


def make_handler(service: TinkerService, key: str):
    routes = json_routes(service)

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format, *args):  # noqa: A002 (the base class's name) - quiet: the SDK polls often
            pass

        def send(self, status: int, body: bytes, content_type: str = "application/json") -> None:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def send_json(self, status: int, value) -> None:
            self.send(status, json.dumps(value).encode())

        def authorized(self) -> bool:
            given = self.headers.get("X-API-Key", "")
            if hmac.compare_digest(given.encode(), key.encode()):
                return True
            self.send_json(401, {"error": "missing or wrong X-API-Key"})
            return False

        def body(self) -> bytes:
            size = int(self.headers.get("Content-Length") or 0)
            if size > MAX_BODY:
                raise WireError(f"request body of {size} bytes is over {MAX_BODY}")
            return self.rfile.read(size) if size else b""

        def do_GET(self):  # noqa: N802 (the base class's naming)
            if not self.authorized():
                return
            path = self.path.split("?", 1)[0]
            try:
                if path == "/api/v1/healthz":
                    return self.send_json(200, {"status": "ok"})
                if path == "/api/v1/get_server_capabilities":
                    return self.send_json(200, capabilities(service))
                if path.startswith("/api/v1/samplers/"):
                    return self.send_json(200, service.sampler_info(path.rsplit("/", 1)[1]))
            except UserError as err:
                return self.send_json(404, {"error": str(err)})
            self.send_json(404, {"error": f"no route GET {path}"})

        def do_POST(self):  # noqa: N802
            if not self.authorized():
                return
            path = self.path.split("?", 1)[0]
            try:
                body = self.body()
                if self.headers.get("Content-Encoding"):
                    raise WireError("compressed request bodies are not accepted")
                if path == "/api/v1/forward_backward":
                    return self.send_json(200, service.forward_backward(body))
                if path == "/api/v1/retrieve_future":
                    return self.retrieve(json.loads(body or b"{}"))
                if path.startswith("/api/v1/sessions/") and path.endswith("/finish"):
                    service.finish_session(path.split("/")[4])
                    return self.send_json(200, {})
                if path not in routes:
                    return self.send_json(404, {"error": f"no route POST {path}"})
                request = json.loads(body or b"{}")
                if not isinstance(request, dict):
                    raise WireError("the body must be a JSON object")
                self.send_json(200, routes[path](request))
            except (WireError, ValueError, KeyError, TypeError) as err:  # json errors are ValueErrors
                self.send_json(400, {"error": f"{type(err).__name__}: {err}"})

        def retrieve(self, request: dict) -> None:
            result = service.retrieve(str(request.get("request_id")))
            if result is None:
                return self.send_json(404, {"error": f"no request {request.get('request_id')!r}"})
            kind, payload = result
            if kind == "proto":
                return self.send(200, payload, PROTO)
            self.send_json(200, payload)

    return Handler


class TinkerServer:
    """The server on a background thread; `base_url` is what ServiceClient(base_url=...) takes."""

    def __init__(self, service: TinkerService, key: str, host: str = "127.0.0.1", port: int = 0):
        if not key.startswith("tml-"):
            raise ValueError("the API key must start with 'tml-' (the tinker SDK refuses other keys)")
        self.httpd = ThreadingHTTPServer((host, port), make_handler(service, key))
        self.httpd.daemon_threads = True
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    @property
    def base_url(self) -> str:
        host, port = self.httpd.server_address[:2]
        return f"http://{host}:{port}"

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def serve_forever(server: TinkerServer, ready: Optional[Callable[[str], None]] = None) -> None:
    if ready is not None:
        ready(server.base_url)
    try:
        server.thread.join()
    except KeyboardInterrupt:
        pass
    finally:
        server.stop()
