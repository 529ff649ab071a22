"""Whether this CPU's GEMM (Paddle's matmul, MKL) rounds a row the same whatever the number of rows beside it.

MKL's AVX2 path (MKL_DEBUG_CPU_TYPE=5, as cpu_env sets it on an AMD EPYC Zen 3) does not: x[:m] @ W for m < 4
differs in its last bits from the first m rows of x @ W; nor does its AVX-512 path (7) on an AMD EPYC Zen 4. The
engine keeps its decode steps at a fixed number of rows; tests that compare a row's bits between runs that put
different numbers of rows through some GEMM need the stronger property and skip without it, saying so.
"""
import functools
import os

import numpy as np
import paddle
import pytest


@functools.lru_cache(maxsize=None)
def rows_are_their_own() -> bool:
    rng = np.random.default_rng(0)
    for k, n in ((64, 64), (576, 576)):
        w = paddle.to_tensor(rng.standard_normal([k, n]).astype("float32"))
        x = paddle.to_tensor(rng.standard_normal([8, k]).astype("float32"))
        full = paddle.matmul(x, w).numpy()
        if not all(np.array_equal(paddle.matmul(x[:m], w).numpy(), full[:m]) for m in range(1, 8)):
            return False
    return True


needs_rows_their_own = pytest.mark.skipif(
    not rows_are_their_own(),
    reason=f"this CPU's GEMM (MKL_DEBUG_CPU_TYPE={os.environ.get('MKL_DEBUG_CPU_TYPE', 'not set')}) rounds a row "
           "differently with the number of rows beside it (tests/gemm_rows.py)")
