"""One event loop per process, on a daemon thread, for environments (and tools) written with `async def`.

`run_awaitable(awaitable)` runs it to completion there and returns its result; callers on several threads at once
(the episode pool) have their coroutines interleave on the one loop, so an async environment's waits overlap
without the environment knowing about threads. An environment that keeps a task running between its calls (a
library's own rollout, waiting for the next turn) starts it with `start_task` and ends it with `cancel_soon` when
the episode is left (cut by max_turns, or another episode's step raised); at exit every task still pending on the
loop is cancelled and awaited, so none is destroyed while pending. Pure Python (no paddle)."""
from __future__ import annotations

import asyncio
import atexit
import os
import threading
from typing import Any, Awaitable, Coroutine, Optional, Set

_loop: Optional[asyncio.AbstractEventLoop] = None
_thread: Optional[threading.Thread] = None
_owner_pid = 0  # the process that started the loop's thread (a forked child has the loop but not the thread)
_lock = threading.Lock()
_tasks: Set[asyncio.Task] = set()  # held until done: asyncio keeps only weak references to tasks
SHUTDOWN_SECONDS = 10.0  # how long the exit waits for cancelled tasks to finish


def _running_loop() -> asyncio.AbstractEventLoop:
    global _loop, _thread, _owner_pid
    with _lock:
        if _loop is None or _loop.is_closed() or _owner_pid != os.getpid():
            loop = asyncio.new_event_loop()
            _thread = threading.Thread(target=loop.run_forever, name="alignment-env-loop", daemon=True)
            _thread.start()
            _loop, _owner_pid = loop, os.getpid()
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


def start_task(coroutine: Coroutine) -> asyncio.Task:
    """A task on the running loop (call from a coroutine on it) that lives until it ends, however little else
    refers to it."""
    task = asyncio.get_running_loop().create_task(coroutine)
    _tasks.add(task)
    task.add_done_callback(_finished)
    return task


def _finished(task: asyncio.Task) -> None:
    _tasks.discard(task)
    if not task.cancelled():
        task.exception()  # retrieved: whoever needed it has read it; asyncio would log it again at collection


def cancel_soon(task: Optional[asyncio.Task]) -> None:
    """Cancel a task of the loop from any thread (its cancellation runs on the loop); a finished task is left."""
    if task is None or task.done():
        return
    loop = task.get_loop()
    if not loop.is_closed():
        loop.call_soon_threadsafe(task.cancel)


async def _cancel_pending() -> None:
    current = asyncio.current_task()
    pending = [task for task in asyncio.all_tasks() if task is not current]
    for task in pending:
        task.cancel()
    if pending:
        await asyncio.wait(pending, timeout=SHUTDOWN_SECONDS)


def shutdown() -> None:
    """Cancel and await every task still pending on the loop, then stop and close it (run at exit)."""
    global _loop
    with _lock:
        loop, thread, _loop = _loop, _thread, None
    if loop is None or loop.is_closed() or _owner_pid != os.getpid():
        return
    if loop.is_running():
        try:
            asyncio.run_coroutine_threadsafe(_cancel_pending(), loop).result(SHUTDOWN_SECONDS + 5)
        except Exception:  # noqa: BLE001 - a task that ignores cancellation: exit anyway
            pass
        loop.call_soon_threadsafe(loop.stop)
        if thread is not None:
            thread.join(SHUTDOWN_SECONDS)
    if not loop.is_running():
        loop.close()


atexit.register(shutdown)
