"""A TCPStore of one's own (alignment/parallel/stores.py): rank 0 serves, the others find it through the launch's
rendezvous store, and every client's socket sends its requests at once (TCP_NODELAY)."""
import os
import socket

import pytest

from alignment.parallel.stores import FD_DIR, connected_tcp_sockets, no_delay_to, rank_zero_store


class Rendezvous:
    """The part of the launch's store rank_zero_store uses."""

    def __init__(self):
        self.values = {}

    def set(self, key, value):
        self.values[key] = value.encode() if isinstance(value, str) else value

    def get(self, key):
        return self.values[key]


def sockets_to(port):
    """TCP_NODELAY of each of this process's sockets connected to `port`."""
    return [sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)
            for sock, peer in connected_tcp_sockets() if peer[1] == port]


@pytest.mark.skipif(not os.path.isdir(FD_DIR), reason="lists the process's sockets through /proc")
def test_a_group_store_serves_from_rank_zero_and_its_clients_send_without_delay():
    rendezvous = Rendezvous()
    served = rank_zero_store(0, "/test/store", "127.0.0.1", rendezvous, 30)
    port = int(rendezvous.get("/test/store").decode().rsplit(":", 1)[1])
    joined = rank_zero_store(1, "/test/store", "127.0.0.1", rendezvous, 30)
    joined.set("answer", "42")
    assert bytes(served.get("answer")) == b"42" and served.add("count", 2) == 2 and joined.add("count", 1) == 3
    flags = sockets_to(port)
    assert len(flags) >= 2 and all(flags), flags  # rank 0's own client and rank 1's
    with socket.create_connection(("127.0.0.1", port)) as plain:
        assert plain.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) == 0
        assert no_delay_to("127.0.0.1", port) == len(flags) + 1
        assert plain.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) == 1
    del joined, served
