"""The kernels' threads are an OpenMP team on Paddle's own runtime (build.openmp_link_flags), the one MKL's GEMMs
run on, and a team smaller than asked for still computes every row, with the same bits."""
import json
import os
import subprocess
import sys

import paddle
import pytest

from alignment.cpu_kernels import build
from tests.helpers import REPO

# thread-count-sensitive outputs of a child process: two row kernels and three decode steps of the layer kernel,
# each asked for 2 threads (enough work for both), as sha256 digests
OUTPUTS = """
import hashlib, json
import numpy as np
import paddle
from alignment.cpu_kernels import build
from alignment.models.fused_decode import FusedDecoder
from tests.cpu_kernels.test_decode_layer import WIDE, step
from tests.models.test_model import tiny_model

lib = build.load_kernels()
rng = np.random.default_rng(5)
z = paddle.to_tensor(rng.standard_normal([157, 600]).astype("float32"))
labels = paddle.to_tensor(rng.integers(0, 600, [157]))
x = paddle.to_tensor(rng.standard_normal([700, 96]).astype("float32"))
w = paddle.to_tensor(rng.standard_normal([96]).astype("float32"))
decoder = FusedDecoder(tiny_model(**WIDE), 3)
caches = [[paddle.to_tensor(rng.standard_normal([3, decoder.kv_heads, 12, decoder.head_dim]).astype("float32"))
           for _ in decoder.layers] for _ in range(2)]
logits, after = step(decoder, caches, 12, 3)
parts = [lib.alignment_token_logprobs(z, labels, 2)[0].numpy(), lib.alignment_rms_norm(x, w, 1e-5, 2)[0].numpy(),
         *logits, *after]
print(json.dumps([len(decoder.kernel_layers), [hashlib.sha256(p.tobytes()).hexdigest() for p in parts]]))
"""


def _outputs(**env):
    env = {**os.environ, "PYTHONPATH": REPO, "ALIGNMENT_CPU_KERNELS": "on", **env}
    done = subprocess.run([sys.executable, "-c", OUTPUTS], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_the_library_links_paddles_openmp_runtime_not_a_second_one(lib):
    runtime = os.path.join(os.path.dirname(paddle.__file__), "libs", "libiomp5.so")
    if not os.path.exists(runtime):
        pytest.skip("this Paddle ships no libiomp5: the kernels link the compiler's OpenMP")
    library = os.path.join(build.build_dir(build.compiler()), build.NAME, f"{build.NAME}.so")
    with open(library, "rb") as f:
        names = f.read()  # the dynamic section's library names are in the file's string table
    assert b"libiomp5.so" in names and b"libgomp.so" not in names


def test_a_team_smaller_than_asked_for_computes_every_row_with_the_same_bits(lib):
    layers, full_team = _outputs()
    assert layers > 0  # the decode layer kernel ran
    assert _outputs(OMP_THREAD_LIMIT="1") == [layers, full_team]  # the runtime gives 1 thread where 2 are asked


def test_the_kernels_team_is_as_large_as_mkls(monkeypatch):
    from alignment import cpu_env, cpu_kernels

    monkeypatch.setenv("MKL_NUM_THREADS", "3")  # a user's or share_cores' count: the kernels follow it
    assert cpu_kernels.threads() == 3
    monkeypatch.setenv("PADDLE_LOCAL_SIZE", "1")
    for unusable in ("", "0", "two"):
        monkeypatch.setenv("MKL_NUM_THREADS", unusable)
        assert cpu_kernels.threads() == cpu_env.usable_cores()
    monkeypatch.delenv("MKL_NUM_THREADS")
    monkeypatch.setenv("PADDLE_LOCAL_SIZE", str(2 * cpu_env.usable_cores()))  # more processes than cores: 1 each
    assert cpu_kernels.threads() == 1
