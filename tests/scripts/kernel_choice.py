"""Run under `python -m paddle.distributed.launch --nproc_per_node 2`: rank r takes ALIGNMENT_CPU_KERNELS from
argv[1 + r], starts the job's groups, and writes which kernels it runs to <output dir>/rank<r>.json.

    kernel_choice.py <rank 0's setting> <rank 1's setting> <output dir>
"""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
rank = int(os.environ["PADDLE_TRAINER_ID"])
os.environ["ALIGNMENT_CPU_KERNELS"] = sys.argv[1 + rank]

from alignment.cpu_env import apply_cpu_defaults  # noqa: E402

apply_cpu_defaults()

from alignment import cpu_kernels  # noqa: E402
from alignment.parallel.distributed import init_distributed  # noqa: E402
from alignment.parallel.layout import Layout  # noqa: E402

init_distributed(Layout(world=2))
with open(os.path.join(sys.argv[3], f"rank{rank}.json"), "w") as f:
    json.dump({name: cpu_kernels.chosen(name) for name in cpu_kernels.REPLACES}, f)
