"""Run under `python -m paddle.distributed.launch --nproc_per_node 2`: both ranks start their groups, then rank 1
reads address 0 (a segmentation fault) in `read_address_zero`; tests/parallel/test_distributed.py reads its log."""
import ctypes
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from alignment.launcher import rank  # noqa: E402
from alignment.parallel.distributed import barrier_all, init_distributed  # noqa: E402


def read_address_zero():
    return ctypes.string_at(0)


if __name__ == "__main__":
    init_distributed()
    barrier_all()
    if rank() == 1:
        read_address_zero()
