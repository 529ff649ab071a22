"""A TCPStore of one's own (alignment/parallel/stores.py): rank 0 serves, the others find it through the launch's
rendezvous store, and every client's socket sends its requests at once (TCP_NODELAY)."""
import os
import socket
import subprocess
import sys
import threading
import time

import pytest

from alignment.launcher import store_address
from alignment.parallel.stores import (FD_DIR, SOCKET_TABLES, connected_tcp_sockets, is_local_address,
                                       listening_ports, no_delay_to, rank_zero_store, wait_until_listening)

EPHEMERAL_PORTS = "/proc/sys/net/ipv4/ip_local_port_range"


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


def free_port():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.mark.skipif(not os.path.exists(SOCKET_TABLES[0]), reason="reads the kernel's socket tables in /proc")
def test_a_rank_waits_for_the_store_to_listen_without_connecting_to_it():
    """The launch's store port may be in the ephemeral range, where a connect() retried before rank 0 listens can
    pick the same port as its source and connect to itself; the wait reads the socket tables instead."""
    port = free_port()
    assert port not in listening_ports()
    server = socket.socket()
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)

    def listen_later():
        time.sleep(0.3)
        server.bind(("127.0.0.1", port))
        server.listen()

    later = threading.Thread(target=listen_later)
    started = time.monotonic()
    later.start()
    try:
        assert wait_until_listening("127.0.0.1", port, timeout=10)
        waited = time.monotonic() - started
        later.join()
        assert 0.3 <= waited < 5 and port in listening_ports()
        server.setblocking(False)
        with pytest.raises(BlockingIOError):  # nobody connected while waiting
            server.accept()
    finally:
        server.close()
    assert not wait_until_listening("127.0.0.1", free_port(), timeout=0.2)  # nobody listens: False after the wait


def test_a_store_on_another_host_is_not_waited_for():
    """192.0.2.0/24 is documentation space, not an address of this machine: no wait, nothing sent."""
    assert is_local_address("127.0.0.1") and not is_local_address("192.0.2.77")
    started = time.monotonic()
    assert wait_until_listening("192.0.2.77", 6070, timeout=30)
    assert time.monotonic() - started < 1


@pytest.mark.parametrize("env, expected", [
    ({"PADDLE_MASTER": "10.1.2.3:38508", "PADDLE_TRAINER_ENDPOINTS": "10.1.2.3:6070,10.1.2.3:6071"},
     ("10.1.2.3", 38508)),
    ({"PADDLE_TRAINER_ENDPOINTS": "192.0.2.1:6070,192.0.2.2:6070"}, ("192.0.2.1", 6070)),
    ({"MASTER_ADDR": "192.0.2.9", "MASTER_PORT": "29500", "PADDLE_MASTER": "10.1.2.3:38508"}, ("10.1.2.3", 38508)),
    ({}, None),
])
def test_the_store_address_is_read_as_paddles_global_store_reads_it(monkeypatch, env, expected):
    for key in ("MASTER_ADDR", "MASTER_PORT", "PADDLE_MASTER", "PADDLE_TRAINER_ENDPOINTS"):
        monkeypatch.delenv(key, raising=False)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    assert store_address() == expected


def ephemeral_start() -> int:
    with open(EPHEMERAL_PORTS) as ranges:
        return int(ranges.read().split()[0])


@pytest.mark.parallel
@pytest.mark.skipif(not os.path.exists(EPHEMERAL_PORTS) or ephemeral_start() < 30000,
                    reason="reads Linux's ephemeral port range, which must start above the suites' slices (30000)")
def test_the_suites_launches_take_their_master_port_below_the_ephemeral_range(tmp_path):
    """tests/conftest.py's PORT_RANGE: a port the launcher picked in the ephemeral range can be taken by another
    test's connection before rank 0 binds it."""
    script = tmp_path / "show_master.py"
    script.write_text("import os\nprint('master', os.environ['PADDLE_MASTER'])\n")
    subprocess.run([sys.executable, "-m", "paddle.distributed.launch", "--nproc_per_node", "1", "--log_dir",
                    str(tmp_path / "logs"), str(script)], check=True, capture_output=True, timeout=120)
    port = int((tmp_path / "logs" / "workerlog.0").read_text().split("master ", 1)[1].split()[0].rsplit(":", 1)[1])
    low, high = (int(bound) for bound in os.environ["PORT_RANGE"].split(":"))
    assert low <= port <= high < ephemeral_start()
