"""One event loop per process, on a daemon thread, for environments (and tools) written with `async def`.

`run_awaitable(awaitable)` runs it to completion there and returns its result; callers on several threads at once
(the episode pool) have their coroutines interleave on the one loop, so an async environment's waits overlap
without the environment knowing about threads. Pure Python (no paddle)."""
from __future__ import annotations

import asyncio
import threading
from typing import Any, Awaitable, Optional

_loop: Optional[asyncio.AbstractEventLoop] = None
_lock = threading.Lock()


def _running_loop() -> asyncio.AbstractEventLoop:
    global _loop
    with _lock:
        if _loop is None or _loop.is_closed():
            loop = asyncio.new_event_loop()
            threading.Thread(target=loop.run_forever, name="alignment-env-loop", daemon=True).start()
            _loop = loop
        return _loop


async def _await(awaitable: Awaitable) -> Any:
    return await awaitable


def run_awaitable(awaitable: Awaitable) -> Any:
    """The awaitable's result (or its exception), computed on the shared loop. Not callable from that loop."""
    loop = _running_loop()
    try:
        current = asyncio.get_running_loop()
    except RuntimeError:
        current = None
    if current is loop:
        raise RuntimeError("run_awaitable called from the environments' own event loop; await it instead")
    return asyncio.run_coroutine_threadsafe(_await(awaitable), loop).result()
