"""Which kernels run faster than the Paddle compositions they replace on this CPU: measured once per CPU, kept.

Each kernel and its composition run forward and backward at SmolLM2-135M's shapes (hidden 576, intermediate 1536,
vocabulary 49,152; 256 rows of logits, 1024 of the rest) on the same random numbers; the three decode kernels run
forward at a decode step's 8 rows (the decode layer also at an RL rollout's widths and from the cache,
DECODE_LAYER_USES), the GEMMs and layers over enough weights to fill twice the last-level cache (a real model's
weights do not fit in it, and from the cache MKL's sgemm was the faster on an Intel Xeon with 300 MB of L3, from
memory the slower). Kernel and composition alternate in blocks of REPEATS calls, ROUNDS times; a kernel is
chosen when its fastest call beats the composition's fastest (the fastest, not the median: a neighbour's load at
that moment slows calls, never speeds them). It takes a few seconds. A load that lasts the whole measurement
(another program on the cores the kernels' threads need) can still reverse a choice, so the CPU time other processes
and the hypervisor's steal used meanwhile is counted (/proc/stat): above BUSY_CORES the next process measures again,
up to MEASUREMENTS times, and the quietest measurement stands. The choice is kept in `cpu_kernels.json` beside
mkl_path's cache (the same directory), keyed by the CPU (mkl_path.cpu_key: vendor, family, model, flags, Paddle's
version) and the library's build directory (its hash covers the source and the compiler); processes starting
together measure once (a file lock).
"""
from __future__ import annotations

import os
import statistics
import time
from typing import Callable, Dict, Tuple

import numpy as np
import paddle
import paddle.nn.functional as F
from paddle import _C_ops

from alignment import cpu_env, mkl_path

CACHE_FILE = "cpu_kernels.json"
REPEATS, ROUNDS = 3, 5
# part of the cache key: a kept choice made another way is measured again
METHOD = "fastest of 15 calls, decode from memory, decode layer at 8, 32 and 16 cached rows"
LOGIT_ROWS, ROWS, HIDDEN, INTER, VOCAB, EPS = 256, 1024, 576, 1536, 49152, 1e-5
SCORES = [8, 9, 128, 128]  # attention at 8 rows of 128 tokens, SmolLM2's 9 heads
QUERIES = [8, 128, 9, 64]  # their queries, for RoPE
DECODE_ROWS, DECODE_BYTES = 8, (64 << 20, 768 << 20)  # the decode GEMMs' rows; their weights' bytes, bounds
# other processes' load above which a measurement is taken again by the next process, up to MEASUREMENTS times:
# a kernel threaded over both cores of a 2-core machine timed 6x slower than its composition while pip ran
BUSY_CORES, MEASUREMENTS = 0.25, 3


def decode_weight_count(k: int, n: int) -> int:
    """How many float32 [k, n] weights fill twice the last-level cache, within DECODE_BYTES."""
    low, high = DECODE_BYTES
    return -(-min(max(2 * cpu_env.last_level_cache_bytes(), low), high) // (k * n * 4))


def decode_candidates(module, threads: int) -> tuple:
    """(the panel GEMMs, paddle.matmul) of 8 rows over decode_weight_count [576, 1536] weights."""
    count = decode_weight_count(HIDDEN, INTER)
    weights = [paddle.full([HIDDEN, INTER], 0.01 * (i % 7 - 3), "float32") for i in range(count)]
    panels = [module.alignment_pack_panels(w, False, threads) for w in weights]
    x = paddle.to_tensor(np.random.default_rng(1).standard_normal([DECODE_ROWS, 1, HIDDEN]).astype("float32"))

    def kernel():
        for packed in panels:
            module.alignment_panel_matmul(x, packed, INTER, threads)

    def composed():
        for weight in weights:
            paddle.matmul(x, weight)

    return kernel, composed


def decode_attention_candidates(module, threads: int) -> tuple:
    """(the decode attention kernel, the Paddle calls it replaces) for one layer of a decode step at 8 rows over
    128 cached columns, SmolLM2's 9 heads, 3 kv heads and head size 64."""
    b, heads, kv, d, width = DECODE_ROWS, 9, 3, 64, 128
    rng = np.random.default_rng(2)
    qkv, cos, sin = (paddle.to_tensor(rng.standard_normal([b, heads + 2 * kv, d]).astype("float32")) for _ in range(3))
    k_cache, v_cache = (paddle.to_tensor(rng.standard_normal([b, kv, width, d]).astype("float32")) for _ in range(2))
    column, bias = paddle.full([b], width - 1, "int64"), paddle.zeros([b, width])
    rotate = np.zeros([d, d], "float32")  # rope.py's rotate_half_matrix
    rotate[np.arange(d // 2), np.arange(d // 2) + d // 2], rotate[np.arange(d // 2) + d // 2, np.arange(d // 2)] = 1, -1
    rotate = paddle.to_tensor(rotate)
    index = paddle.expand(column.reshape([b, 1, 1, 1]), [b, kv, 1, d])
    scores_bias = paddle.zeros([b, kv, heads // kv, width])

    def kernel():
        module.alignment_decode_attention(qkv, cos, sin, k_cache, v_cache, column, bias, heads, False, threads)

    def composed():  # fused_decode.py's FusedDecoder._layer from q | k | v to the attention's output
        roped = qkv * cos + paddle.matmul(qkv, rotate) * sin
        q, k, v = paddle.split(roped, [heads, kv, kv], axis=1)
        k_cache.put_along_axis_(index, k.reshape([b, kv, 1, d]), 2)
        v_cache.put_along_axis_(index, v.reshape([b, kv, 1, d]), 2)
        scores = paddle.matmul(q.reshape([b, kv, heads // kv, d]), k_cache, transpose_y=True)
        paddle.matmul(F.softmax(scores + scores_bias, axis=-1), v_cache).reshape([b, 1, heads * d])

    return kernel, composed


# (rows, distinct layers): the decode layer kernel's uses, timed together: a decode step at DECODE_ROWS and at an RL
# rollout's width through real-model layers streamed from memory (0: as many as fill twice the last-level cache),
# and an RL width through two layers in turn, which stay in the cache (a small policy)
DECODE_LAYER_USES = ((DECODE_ROWS, 0), (32, 0), (16, 2))


def decode_layer_candidates(module, threads: int) -> tuple:
    """(the decode layer kernel over its panels, the layer as fused_decode.py's `_kernel_layer` runs it: our norm,
    attention and SwiGLU kernels between MKL's GEMMs, the fastest composition) through SmolLM2 layers ([576, 960],
    [576, 576], [576, 1536] twice and [1536, 576]) over 128 cached columns, at each of DECODE_LAYER_USES (a layer
    in the cache runs as many times as one from memory)."""
    heads, kv, d, width = 9, 3, 64, 128
    shapes = [[HIDDEN, (heads + 2 * kv) * d], [heads * d, HIDDEN], [HIDDEN, INTER], [HIDDEN, INTER], [INTER, HIDDEN]]
    streamed = decode_weight_count(1, sum(k * n for k, n in shapes))
    rng = np.random.default_rng(3)
    layers = [[paddle.full(shape, 0.01 * ((i + j) % 7 - 3), "float32") for j, shape in enumerate(shapes)]
              for i in range(streamed)]
    packed = [[module.alignment_pack_panels(w, False, threads) for w in layer] for layer in layers]
    norm = paddle.ones([HIDDEN])
    uses = []  # (rows, x, cos, sin, the caches of each layer, column, bias, the layers in order) of each use
    for b, resident in DECODE_LAYER_USES:
        order = [i % (resident or streamed) for i in range(streamed)]
        x = paddle.to_tensor(rng.standard_normal([b, 1, HIDDEN]).astype("float32"))
        cos, sin = (paddle.to_tensor(rng.standard_normal([b, heads + 2 * kv, d]).astype("float32")) for _ in range(2))
        caches = [[paddle.zeros([b, kv, width, d]) for _ in range(2)] for _ in range(max(order) + 1)]
        column, bias = paddle.full([b], width - 1, "int64"), paddle.zeros([b, width])
        uses.append((b, x, cos, sin, caches, column, bias, order))

    def kernel():
        for _, x, cos, sin, caches, column, bias, order in uses:
            for i in order:
                (qkv, o, gate, up, down), (k_cache, v_cache) = packed[i], caches[i]
                module.alignment_decode_layer(x, norm, qkv, cos, sin, k_cache, v_cache, column, bias, o, norm, gate,
                                              up, down, heads, False, EPS, threads)

    def composed():
        for b, x, cos, sin, caches, column, bias, order in uses:
            for i in order:
                (qkv, o, gate, up, down), (k_cache, v_cache) = layers[i], caches[i]
                h = module.alignment_rms_norm(x, norm, EPS, threads)[0]
                q = paddle.matmul(h, qkv).reshape([b, -1, d])
                out = module.alignment_decode_attention(q, cos, sin, k_cache, v_cache, column, bias, heads, False,
                                                        threads)[0]
                x1 = x + paddle.matmul(out, o)
                h = module.alignment_rms_norm(x1, norm, EPS, threads)[0]
                x1 + paddle.matmul(module.alignment_swiglu(paddle.matmul(h, gate), paddle.matmul(h, up), threads),
                                   down)

    return kernel, composed


def cache_file() -> str:
    return os.path.join(os.path.dirname(mkl_path.cache_file()), CACHE_FILE)


def _leaf(array):
    tensor = paddle.to_tensor(array)
    tensor.stop_gradient = False
    return tensor


def candidates(module, threads: int) -> Dict[str, tuple]:
    """name -> (kernel's forward + backward, the composition's) over the same inputs."""
    rng = np.random.default_rng(0)
    logits = _leaf(rng.standard_normal([LOGIT_ROWS, VOCAB]).astype("float32") * 3)  # [N, V]
    labels = paddle.to_tensor(rng.integers(0, VOCAB, [LOGIT_ROWS]))  # [N]
    x = _leaf(rng.standard_normal([ROWS, HIDDEN]).astype("float32"))  # [R, H]
    weight = _leaf(np.ones([HIDDEN], "float32"))  # [H]
    gate, up = (_leaf(rng.standard_normal([ROWS, INTER]).astype("float32")) for _ in range(2))  # [R, I]
    scores = _leaf(rng.standard_normal(SCORES).astype("float32"))  # [b, h, s, t]
    causal = np.triu(np.full(SCORES[2:], -1e9, "float32"), 1)  # [s, t]
    bias = paddle.to_tensor(np.broadcast_to(causal, SCORES).copy())  # [b, h, s, t]
    q = _leaf(rng.standard_normal(QUERIES).astype("float32"))  # [b, s, h, d]
    cos, sin = (paddle.to_tensor(rng.standard_normal(QUERIES).astype("float32")) for _ in range(2))
    rotate = paddle.to_tensor(np.roll(np.eye(QUERIES[-1], dtype="float32"), QUERIES[-1] // 2, axis=1))  # a permutation

    def run(*outputs):
        paddle.autograd.backward([o.sum() for o in outputs])

    def composed_log_probs():
        _, nll = _C_ops.cross_entropy_with_softmax(logits, labels.reshape([-1, 1]), False, True, True, -100, -1)
        run(-nll)

    def composed_rms_norm():
        normed = x * paddle.rsqrt(paddle.square(x).mean(axis=-1, keepdim=True) + EPS)
        run(normed * paddle.expand(weight, normed.shape))

    return {
        "token_log_probs": (lambda: run(module.alignment_token_logprobs(logits, labels, threads)[0]),
                            composed_log_probs),
        "rms_norm": (lambda: run(module.alignment_rms_norm(x, weight, EPS, threads)[0]), composed_rms_norm),
        "swiglu": (lambda: run(module.alignment_swiglu(gate, up, threads)), lambda: run(F.silu(gate) * up)),
        "attention_softmax": (lambda: run(module.alignment_attention_softmax(scores, bias, threads)),
                              lambda: run(F.softmax(scores + bias, axis=-1))),
        "rope": (lambda: run(module.alignment_rope(q, cos, sin, False, threads)),
                 lambda: run((q * cos + paddle.matmul(q, rotate) * sin).transpose([0, 2, 1, 3]))),
        "decode_matmul": decode_candidates(module, threads),
        "decode_attention": decode_attention_candidates(module, threads),
        "decode_layer": decode_layer_candidates(module, threads),
    }


def _time_ms(fn: Callable[[], None], times: list) -> None:
    fn()
    for _ in range(REPEATS):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1e3)


def measure(module, threads: int) -> Dict[str, Dict[str, float]]:
    """name -> {"kernel_ms", "paddle_ms"} (the fastest calls) and their medians, alternating blocks."""
    figures = {}
    for name, (kernel, composed) in candidates(module, threads).items():
        ours, theirs = [], []
        for _ in range(ROUNDS):
            _time_ms(kernel, ours)
            _time_ms(composed, theirs)
        figures[name] = {"kernel_ms": min(ours), "paddle_ms": min(theirs),
                         "kernel_median_ms": statistics.median(ours), "paddle_median_ms": statistics.median(theirs)}
    return figures


def cpu_seconds() -> Tuple[float, float]:
    """(CPU seconds every process and the hypervisor's steal have used since boot, this process's and its waited
    children's); (0, 0) where /proc/stat is missing."""
    try:
        with open("/proc/stat", encoding="ascii") as f:
            user, nice, system, _idle, _iowait, irq, softirq, steal = (int(v) for v in f.readline().split()[1:9])
    except (OSError, ValueError):
        return 0.0, 0.0
    own = os.times()
    return ((user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK"),
            own.user + own.system + own.children_user + own.children_system)


def others_cores(before: Tuple[float, float], after: Tuple[float, float], wall_s: float) -> float:
    """The cores other processes (and steal) kept busy on average between two cpu_seconds() readings."""
    return max(0.0, (after[0] - before[0]) - (after[1] - before[1])) / max(wall_s, 1e-9)


def _settled(entry) -> bool:
    """A kept entry is final when measured on a quiet machine or MEASUREMENTS times (the quietest then stands)."""
    return entry.get("others_cores", 0.0) <= BUSY_CORES or entry.get("measurements", 1) >= MEASUREMENTS


def measured_choice(module, remeasure: bool = False) -> Dict[str, bool]:
    """name -> whether the kernel is chosen on this CPU (measured once on a quiet machine, kept)."""
    from alignment.cpu_kernels import build, threads

    path = cache_file()
    library = os.path.basename(build.build_dir(build.compiler()))
    key = f"{mkl_path.cpu_key(cpu_env.cpuinfo_fields())} build {library} {METHOD}"
    with mkl_path._locked(path):
        kept = mkl_path.read_cache(path)
        entry = kept.get(key) if isinstance(kept.get(key), dict) else None
        if entry is not None and not remeasure and _settled(entry):
            return dict(entry["chosen"])
        before, start = cpu_seconds(), time.perf_counter()
        figures = measure(module, threads())
        busy = others_cores(before, cpu_seconds(), time.perf_counter() - start)
        chosen = {name: f["kernel_ms"] < f["paddle_ms"] for name, f in figures.items()}
        count = 1 if entry is None or remeasure else entry.get("measurements", 1) + 1
        if entry is None or remeasure or busy < entry.get("others_cores", 0.0):
            entry = {"chosen": chosen, "ms": figures, "others_cores": round(busy, 3)}
        kept[key] = dict(entry, measurements=count)  # silent: a program's output stays the same on a busy machine
        mkl_path._write_cache(path, kept)  # not kept when the directory is not writable: measured again next time
    return dict(entry["chosen"])
