"""A TCPStore of one's own: served by rank 0 of a group on a free port of its address, found by the others under
a key of the launch's rendezvous store. Used where a shared store would mix up its users (gloo group rendezvous,
alignment/parallel/cpu_standins.py) or share a socket between threads (heartbeats, alignment/parallel/watchdog.py;
asynchronous RL's mailbox, alignment/ppo/asynchronous.py).

Paddle's TCPStore client sends a request in several small writes and leaves Nagle's algorithm on, so every write
after the first waits for the store's delayed ACK (40 ms on Linux): on loopback an `add` took 42 ms and a `get`
88 ms, 0.05 and 0.09 ms with TCP_NODELAY on the client's socket. `rank_zero_store` sets it.
"""
from __future__ import annotations

import os
import socket

FD_DIR = "/proc/self/fd"


def connected_tcp_sockets():
    """(socket, peer address) for each of this process's connected TCP sockets, as duplicates of their descriptors
    (closing one leaves the original open); nothing where the descriptors cannot be listed."""
    try:
        descriptors = [int(name) for name in os.listdir(FD_DIR)]
    except OSError:
        return
    for fd in descriptors:
        try:
            sock = socket.socket(fileno=os.dup(fd))
        except OSError:  # not a socket, or closed since the listing
            continue
        with sock:
            try:
                if sock.type != socket.SOCK_STREAM or sock.family not in (socket.AF_INET, socket.AF_INET6):
                    continue
                peer = sock.getpeername()
            except OSError:  # a listening or unconnected socket
                continue
            yield sock, peer


def no_delay_to(host: str, port: int) -> int:
    """Sets TCP_NODELAY on this process's TCP sockets connected to host:port; returns how many."""
    addresses = {info[4][0] for info in socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)}
    found = 0
    for sock, peer in connected_tcp_sockets():
        if peer[1] == port and peer[0] in addresses:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            found += 1
    return found


def rank_zero_store(group_rank: int, key: str, host: str, rendezvous, timeout: int):
    """Rank 0 serves a fresh store on `host` and publishes its address under `key` of `rendezvous`; the other
    ranks wait for the key and connect. Every client's requests go out unbuffered (TCP_NODELAY)."""
    from paddle.base import core

    if group_rank == 0:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
            probe.bind((host, 0))
            port = probe.getsockname()[1]
        store = core.TCPStore(host, port, True, 0, timeout)  # world size 0: listening on return, no wait
        rendezvous.set(key, f"{host}:{port}")
    else:
        host, port = bytes(rendezvous.get(key)).decode().rsplit(":", 1)  # get() waits for the key
        port = int(port)
        store = core.TCPStore(host, port, False, 0, timeout)
    no_delay_to(host, port)
    return store
