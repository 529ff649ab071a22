"""Lost-rank detection: a process whose peer (or the peer's whole host) is gone exits with a message instead of
hanging in its next collective.

On one host paddle.distributed.launch already stops every process when one dies. Across hosts it cannot: the
other hosts' launchers never hear of it, and their processes wait in gloo / NCCL collectives for up to 30 minutes.
So every rank runs two daemon threads:

    heartbeat  every `interval` s: add 1 to this rank's counter in a small TCPStore hosted by rank 0 (its own
               store, not the rendezvous one, so no other thread ever shares its socket), and read every rank's
    deadline   if some rank's counter has not moved for `timeout` s, or the store itself has not answered for
               `timeout` s (rank 0's host is gone), print which rank and host is lost and exit(1) at once

Threads keep beating while the main thread computes or waits in a collective (Paddle releases the GIL there), so
only a dead process or host stops its counter. `timeout` is the training argument `lost_rank_timeout`.
"""
from __future__ import annotations

import atexit
import os
import sys
import threading
import time

from alignment.launcher import endpoints
from alignment.parallel.stores import rank_zero_store

_started = None


def _host_of(rank: int) -> str:
    hosts = endpoints()
    return hosts[rank].rsplit(":", 1)[0] if rank < len(hosts) else "?"


def _heartbeat_store(rank: int, timeout: float):
    """Rank 0 serves a fresh TCPStore, announced in the launch's store (created by init_parallel_env)."""
    from paddle.base import core

    host = _host_of(0) if endpoints() else "127.0.0.1"
    return rank_zero_store(rank, "/alignment/heartbeat_store", host, core.create_or_get_global_tcp_store(),
                           int(timeout))


class Watchdog:
    def __init__(self, rank: int, world: int, timeout: float, interval: float):
        self.rank, self.world, self.timeout, self.interval = rank, world, timeout, interval
        self.store = _heartbeat_store(rank, timeout)
        now = time.monotonic()
        self.last_answer = now  # when the store last answered
        self.counts = {r: (-1, now) for r in range(world)}  # rank: (last count seen, when it last changed)
        self.exiting = False
        self.threads = []

    def beat(self) -> None:
        try:
            while not self.exiting:
                self.store.add(f"beat/{self.rank}", 1)
                now = time.monotonic()
                for r in range(self.world):
                    count = self.store.add(f"beat/{r}", 0)  # a read that does not wait for the key
                    if count != self.counts[r][0] or self.store.add(f"done/{r}", 0):
                        self.counts[r] = (count, now)  # a rank that finished normally counts as alive
                self.last_answer = now
                time.sleep(self.interval)
        except Exception:  # the store is gone: watch() reports it once `timeout` has passed
            return

    def finished(self) -> None:
        """At a normal exit: stop both threads (none may be inside a store call while the interpreter tears
        down), then tell the others this rank is done, so they do not count it as lost."""
        self.exiting = True
        for thread in self.threads:
            thread.join(timeout=4 * self.interval)
        try:
            self.store.add(f"done/{self.rank}", 1)
            if self.rank == 0:  # the store lives in this process: let the others finish with it first
                deadline = time.monotonic() + 5 * self.interval
                while time.monotonic() < deadline and not all(self.store.add(f"done/{r}", 0)
                                                              for r in range(1, self.world)):
                    time.sleep(0.05)
        except Exception:
            pass

    def watch(self) -> None:
        while not self.exiting:
            time.sleep(self.interval)
            if self.exiting:
                return
            now = time.monotonic()
            if now - self.last_answer > self.timeout:
                self.stop(f"the heartbeat store on rank 0's host {_host_of(0)} has not answered for "
                          f"{now - self.last_answer:.0f} s: rank 0 or its host is lost")
            for r, (_, changed) in self.counts.items():
                if r != self.rank and now - changed > self.timeout:
                    self.stop(f"rank {r} (host {_host_of(r)}) has sent no heartbeat for {now - changed:.0f} s: "
                              "the process or its host is lost")

    def stop(self, why: str) -> None:
        print(f"error: rank {self.rank} (host {_host_of(self.rank)}) stops: {why} (key 'lost_rank_timeout' = "
              f"{self.timeout:g} s). Completed checkpoints under output_dir are intact: restart the job with "
              "resume_from_checkpoint auto.", file=sys.stderr, flush=True)
        os._exit(1)  # the main thread may be blocked in a collective that will never complete


def start_watchdog(rank: int, world: int, timeout: float, interval: float = 2.0) -> None:
    """Start the two threads once per process (no-op for one process or timeout <= 0)."""
    global _started
    if _started is not None or world <= 1 or timeout <= 0:
        return
    _started = Watchdog(rank, world, timeout, min(interval, timeout / 4))
    _started.threads = [threading.Thread(target=_started.beat, name="alignment-heartbeat", daemon=True),
                        threading.Thread(target=_started.watch, name="alignment-watchdog", daemon=True)]
    for thread in _started.threads:
        thread.start()
    atexit.register(_started.finished)


def stop_watchdog() -> None:
    """Stop this process's watchdog now, as at a normal exit (for a process that leaves without atexit)."""
    if _started is not None:
        _started.finished()

