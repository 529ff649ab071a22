"""A TCPStore of one's own: served by rank 0 of a group on a free port of its address, found by the others under
a key of the launch's rendezvous store. Used where a shared store would mix up its users (gloo group rendezvous,
alignment/parallel/cpu_standins.py) or share a socket between threads (heartbeats, alignment/parallel/watchdog.py).
"""
from __future__ import annotations

import socket


def rank_zero_store(group_rank: int, key: str, host: str, rendezvous, timeout: int):
    """Rank 0 serves a fresh store on `host` and publishes its address under `key` of `rendezvous`; the other
    ranks wait for the key and connect."""
    from paddle.base import core

    if group_rank == 0:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
            probe.bind((host, 0))
            port = probe.getsockname()[1]
        store = core.TCPStore(host, port, True, 0, timeout)  # world size 0: listening on return, no wait
        rendezvous.set(key, f"{host}:{port}")
        return store
    host, port = bytes(rendezvous.get(key)).decode().rsplit(":", 1)  # get() waits for the key
    return core.TCPStore(host, int(port), False, 0, timeout)
