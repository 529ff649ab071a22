"""Tools served by an MCP server (the `mcp` package's client), listed and called like our own tools.

    {"mcp": {"command": "python", "args": ["my_server.py"]}}          # started here, spoken to over stdio
    {"mcp": {"url": "http://127.0.0.1:8000/mcp"}}                      # a running server, streamable HTTP

An entry of this shape in the `tools` environment's `tools` list (or `mcp_tools(spec)` in Python) becomes one
`Tool` per tool the server lists: the schema the policy is shown is the server's own (name, description and
`inputSchema` as `parameters`, passed through unchanged), and a call is the server's `tools/call`; a result
with `isError` is an error text the policy reads, as a raising tool's is. `"tools": ["a", "b"]` keeps only
those tools. An agent program uses the same object: `MCPServer(spec).schemas()` for the `tools` of its model
calls and `.call(name, arguments)` for each call the model makes.

One connection per server spec per process, held open on the environments' event loop (event_loop.py) by a
task that owns the client's context managers, and closed with that loop at exit (a stdio server is then
stopped). A server started over stdio runs under the python sandbox's resource limits (`limits`: SandboxLimits'
`memory_bytes` and `file_bytes`, by default the sandbox's; `cpu_seconds` only when given, since it counts the
server's whole life), set by sandbox/mcp_limits.py before it executes the command; the sandbox's kernel containment
(namespaces, Landlock, seccomp) is not applied to a server, which may need its own files and network.
Works with the `mcp` package 1.x and 2.x.
"""
from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import json
import os
import sys
from typing import Any, Dict, List, Mapping, Optional

from alignment.envs.event_loop import run_awaitable, start_task
from alignment.envs.sandbox.runner import sandbox_limits
from alignment.envs.tools import DEFAULT_TIMEOUT, Tool

_LIMITS_SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "sandbox", "mcp_limits.py")
_KEYS = ("command", "args", "env", "cwd", "url", "tools", "limits", "timeout")


class MCPToolError(RuntimeError):
    """The server answered the call with `isError` (its text is the message)."""


def _checked_spec(spec: Any) -> Dict[str, Any]:
    if not isinstance(spec, Mapping):
        raise ValueError(f"mcp: a server is a mapping with 'command' or 'url', got {spec!r}")
    unknown = sorted(set(spec) - set(_KEYS))
    if unknown:
        raise ValueError(f"mcp: unknown key {unknown[0]!r} (known: {', '.join(_KEYS)})")
    if ("command" in spec) == ("url" in spec):
        raise ValueError("mcp: give one of 'command' (a server started here, over stdio) and 'url' (a running "
                         "server, streamable HTTP)")
    if "url" in spec and ("limits" in spec or "args" in spec or "env" in spec or "cwd" in spec):
        raise ValueError("mcp: 'args', 'env', 'cwd' and 'limits' apply to a server started with 'command'")
    args = spec.get("args", [])
    if not isinstance(args, (list, tuple)) or not all(isinstance(arg, str) for arg in args):
        raise ValueError(f"mcp: 'args' must be a list of strings, got {args!r}")
    return dict(spec)


def _server_limits(options: Optional[Mapping[str, Any]]) -> Dict[str, int]:
    """The rlimits a stdio server starts under: memory and file bytes (the sandbox's defaults), CPU if given."""
    options = dict(options or {})
    known = ("memory_bytes", "file_bytes", "cpu_seconds")
    unknown = sorted(set(options) - set(known))
    if unknown:
        raise ValueError(f"mcp: 'limits' has {unknown[0]!r}; a server takes {', '.join(known)}")
    checked = sandbox_limits(options)  # the sandbox's own bounds checks
    limits = {"memory_bytes": checked.memory_bytes, "file_bytes": checked.file_bytes}
    if "cpu_seconds" in options:
        limits["cpu_seconds"] = checked.cpu_seconds
    return limits


class MCPServer:
    """One MCP server's tools: `schemas()` (OpenAI function-calling schemas), `call(name, arguments)` -> text,
    `tools()` (Tool objects for the `tools` environment). Build with `MCPServer(spec)` or the shared `connected`."""

    def __init__(self, spec: Mapping[str, Any]):
        self.spec = _checked_spec(spec)
        self.timeout = float(self.spec.get("timeout", DEFAULT_TIMEOUT))
        self.limits = _server_limits(self.spec.get("limits")) if "command" in self.spec else {}
        self.label = self.spec.get("url") or " ".join([self.spec["command"], *self.spec.get("args", [])])
        self.session: Any = None
        self.listed: List[Any] = []
        self._stop: Optional[asyncio.Event] = None
        self._holder: Optional[asyncio.Task] = None
        try:
            run_awaitable(self._open())
        except Exception as err:  # noqa: BLE001 - whatever the transport raised: one line naming the server
            raise ValueError(f"mcp server {self.label!r}: cannot connect ({_reason(err)})") from None
        wanted = self.spec.get("tools")
        names = [tool.name for tool in self.listed]
        if wanted is not None:
            missing = [name for name in wanted if name not in names]
            if missing:
                raise ValueError(f"mcp server {self.label!r} has no tool {missing[0]!r} (it has: {', '.join(names)})")
            self.listed = [tool for tool in self.listed if tool.name in wanted]

    async def _open(self) -> None:
        ready: asyncio.Future = asyncio.get_running_loop().create_future()
        self._stop = asyncio.Event()
        self._holder = start_task(self._hold(ready))
        await ready

    async def _hold(self, ready: asyncio.Future) -> None:
        """Own the transport and session for the connection's life (anyio's context managers must be left by the
        task that entered them)."""
        from mcp import ClientSession
        try:
            async with contextlib.AsyncExitStack() as stack:
                streams = await stack.enter_async_context(self._transport())
                session = await stack.enter_async_context(ClientSession(streams[0], streams[1]))
                await session.initialize()
                listed = await session.list_tools()
                self.session, self.listed = session, list(listed.tools)
                ready.set_result(None)
                await self._stop.wait()
        except BaseException as err:
            if not ready.done():
                ready.set_exception(err if isinstance(err, Exception) else RuntimeError(repr(err)))
                return
            raise

    def _transport(self):
        if "url" in self.spec:
            from mcp.client import streamable_http
            return streamable_http.streamable_http_client(self.spec["url"])  # yields 3 streams in 1.x, 2 in 2.x
        from mcp import StdioServerParameters, stdio_client
        command = [self.spec["command"], *self.spec.get("args", [])]
        wrapped = ["-I", _LIMITS_SCRIPT, json.dumps(self.limits), *command]
        return stdio_client(StdioServerParameters(command=sys.executable, args=wrapped, env=self.spec.get("env"),
                                                  cwd=self.spec.get("cwd")))

    def schemas(self) -> List[Dict[str, Any]]:
        """The listed tools as OpenAI function-calling schemas, the server's input schema passed through."""
        return [{"type": "function", "function": {"name": tool.name, "description": tool.description or "",
                                                  "parameters": _dumped(tool)["inputSchema"]}} for tool in self.listed]

    def call(self, name: str, arguments: Optional[Mapping[str, Any]] = None) -> str:
        """The tool's result as text (its text parts joined, else its structured content as JSON); MCPToolError
        when the server reports an error."""
        call = asyncio.wait_for(self.session.call_tool(name, dict(arguments or {})), self.timeout)
        result = _dumped(run_awaitable(call))
        texts = [part.get("text", "") for part in result.get("content") or [] if part.get("type") == "text"]
        text = "\n".join(texts) if texts else json.dumps(result.get("structuredContent"), ensure_ascii=False)
        if result.get("isError"):
            raise MCPToolError(text)
        return text

    def tools(self) -> List[Tool]:
        return [Tool(schema["function"]["name"], _ToolCall(self, schema["function"]["name"]), schema,
                     self.timeout + 1.0) for schema in self.schemas()]

    def close(self) -> None:
        if self._stop is not None and self._holder is not None and not self._holder.done():
            self._holder.get_loop().call_soon_threadsafe(self._stop.set)


@dataclasses.dataclass(frozen=True)
class _ToolCall:
    """A listed tool as the function a Tool calls (any keyword arguments: the server checks them)."""
    server: MCPServer
    name: str

    def __call__(self, **arguments: Any) -> str:
        return self.server.call(self.name, arguments)


def _dumped(model: Any) -> Dict[str, Any]:
    return model.model_dump(by_alias=True, mode="json")


def _reason(err: BaseException) -> str:
    inner = getattr(err, "exceptions", None)  # an anyio task group's ExceptionGroup: its first cause
    if inner:
        return _reason(inner[0])
    return f"{type(err).__name__}: {err}".replace("\n", " ")


@functools.lru_cache(maxsize=None)
def _shared(spec_json: str) -> MCPServer:
    return MCPServer(json.loads(spec_json))


def connected(spec: Mapping[str, Any]) -> MCPServer:
    """The process's one connection to the server `spec` names (opened on first use)."""
    return _shared(json.dumps(_checked_spec(spec), sort_keys=True))


def mcp_tools(spec: Mapping[str, Any]) -> List[Tool]:
    """The Tools of the MCP server `spec` names (a `tools` environment entry's "mcp" value)."""
    return connected(spec).tools()


__all__ = ["MCPServer", "MCPToolError", "connected", "mcp_tools"]
