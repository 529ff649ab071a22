"""Thread settings that make Paddle fast on small CPUs; they only take effect before paddle is imported.

Measured on a 2-core AMD EPYC (see README, "CPU performance"): OMP_NUM_THREADS=1 with MKL_NUM_THREADS=2 ran
eager training 3-4x faster than OMP_NUM_THREADS=2, and MKL_DEBUG_CPU_TYPE=5 lets the MKL bundled with paddle
take its AVX2 code paths on AMD CPUs (ignored elsewhere). FLAGS_use_stride_kernel=0 makes transpose and slicing
copy with dense kernels instead of returning strided views: on CPU the backward of later ops on those views
(reshape, broadcast add) took most of the gap to the peer, and one PPO step on the benchmark shape went from
2.857 s to 2.021 s (benchmarks/README.md). FLAGS_new_executor_serial_run=1 runs a static program's ops on the
calling thread: the executor's own worker threads competed with MKL's for the 2 cores (a static decode step took
9.1 ms with them, 4.6 ms without). Values the user already set are left alone.
"""
import os
import sys

CPU_THREAD_DEFAULTS = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "2", "MKL_DEBUG_CPU_TYPE": "5",
                       "FLAGS_use_stride_kernel": "0", "FLAGS_new_executor_serial_run": "1"}


def set_cpu_thread_defaults() -> bool:
    """Set the defaults for unset variables; return False when paddle was already imported (too late)."""
    for key, value in CPU_THREAD_DEFAULTS.items():
        os.environ.setdefault(key, value)
    return "paddle" not in sys.modules
