"""What `python -m paddle.distributed.launch` tells each process through its environment: the one place that
reads it. A plain `python ...` run is one process, rank 0, with no endpoints."""
from __future__ import annotations

import os
from typing import List, Optional, Tuple


def world_size() -> int:
    return int(os.environ.get("PADDLE_TRAINERS_NUM", "1"))


def rank() -> int:
    return int(os.environ.get("PADDLE_TRAINER_ID", "0"))


def local_processes() -> int:
    """How many processes the launch started on this host (the CPU cores are shared among them)."""
    return max(1, int(os.environ.get("PADDLE_LOCAL_SIZE", "1")))


def ranks_on_host() -> range:
    """The ranks of the processes on this process's host."""
    first = rank() - int(os.environ.get("PADDLE_RANK_IN_NODE", "0"))
    return range(first, first + local_processes())


def speaks_for_all() -> bool:
    """Rank 0 prints what every rank would print alike (arguments, notices)."""
    return rank() == 0


def endpoints() -> List[str]:
    """host:port of every rank, in rank order."""
    return [e for e in os.environ.get("PADDLE_TRAINER_ENDPOINTS", "").split(",") if e]


def store_address() -> Optional[Tuple[str, int]]:
    """host, port of the store every rank meets at in init_parallel_env, read as Paddle's global TCPStore reads it
    (phi/core/distributed/store/store_utils.cc): PADDLE_MASTER, else the first endpoint (None in a plain run)."""
    address = os.environ.get("PADDLE_MASTER") or next(iter(endpoints()), None)
    if not address:
        return None
    host, port = address.rsplit(":", 1)
    return host, int(port)
