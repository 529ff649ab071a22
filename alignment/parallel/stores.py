"""A TCPStore of one's own: served by rank 0 of a group on a free port of its address, found by the others under
a key of the launch's rendezvous store. Used where a shared store would mix up its users (gloo group rendezvous,
alignment/parallel/cpu_standins.py) or share a socket between threads (heartbeats, alignment/parallel/watchdog.py;
asynchronous RL's mailbox, alignment/ppo/asynchronous/asynchronous.py).

Paddle's TCPStore client sends a request in several small writes and leaves Nagle's algorithm on, so every write
after the first waits for the store's delayed ACK (40 ms on Linux): on loopback an `add` took 42 ms and a `get`
88 ms, 0.05 and 0.09 ms with TCP_NODELAY on the client's socket. `rank_zero_store` sets it.

`wait_until_listening` keeps the other ranks from connecting to the launch's own store before rank 0 serves it.
"""
from __future__ import annotations

import os
import socket
import time
from typing import Set

FD_DIR = "/proc/self/fd"
SOCKET_TABLES = ("/proc/net/tcp", "/proc/net/tcp6")
LISTEN = "0A"  # the state column of a listening socket in those tables


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


def is_local_address(host: str) -> bool:
    """Whether `host` names an address of this machine (a socket can be bound to it); nothing is sent."""
    try:
        infos = socket.getaddrinfo(host, 0, type=socket.SOCK_STREAM)
    except OSError:
        return False
    for family, kind, proto, _, address in infos:
        try:
            with socket.socket(family, kind, proto) as probe:
                probe.bind(address)
                return True
        except OSError:
            continue
    return False


def listening_ports() -> Set[int]:
    """The TCP ports something on this machine listens on, from the kernel's socket tables (empty if unreadable)."""
    ports = set()
    for table in SOCKET_TABLES:
        try:
            with open(table) as rows:
                next(rows, None)  # the header
                for row in rows:
                    fields = row.split()
                    if len(fields) > 3 and fields[3] == LISTEN:
                        ports.add(int(fields[1].rsplit(":", 1)[1], 16))
        except OSError:
            continue
    return ports


def wait_until_listening(host: str, port: int, timeout: float, poll: float = 0.05) -> bool:
    """On the host of the launch's store, wait (without connecting) until it listens, at most `timeout` seconds;
    True once it does, or at once when the store is on another host (or the socket tables cannot be read).

    Why: Paddle's launcher picks the store's port in 35100-64000, which overlaps Linux's ephemeral range
    (32768-60999 by default), and a rank's TCPStore client retries connect() (about once a second) until rank 0
    listens. A retry whose kernel-chosen source port equals the store's port connects to itself (a Python loop
    retrying a closed 127.0.0.1:38508 did after 24821 attempts); that rank then reads its own request back and
    stops, and rank 0 cannot listen on the taken port and aborts (`uv__finish_close` assertion; seen once in CI). Self-connection needs the same
    address on both ends, so only ranks on the store's host wait."""
    if not is_local_address(host) or not os.path.exists(SOCKET_TABLES[0]):
        return True
    deadline = time.monotonic() + timeout
    while port not in listening_ports():
        if time.monotonic() > deadline:
            return False
        time.sleep(poll)
    return True
