"""The operations of a SmolLM2-135M step, alone: Paddle against torch on this CPU, milliseconds per call.

    python benchmarks/bench_cpu_ops.py [--repeats 9] [--record | --results-dir DIR | --no-save]

Where a model step is slower than transformers', this tells whether the GEMMs or the other kernels are behind.
Each operation runs at the shape the benchmark step of bench_smollm2.py gives it (8 x 128 tokens, hidden 576,
intermediate 1536, 9 heads, vocabulary 49,152; the decode GEMMs at its generate workload's 8 rows), on the same
numbers in both libraries, alternating Paddle and
torch in blocks of --repeats calls (3 rounds, a warm-up call and an idle half second before each block); medians
are reported. Paddle runs under alignment/cpu_env.py's settings (OpenMP 1 thread, MKL the usable cores), torch
with `torch.set_num_threads(usable cores)`, both in this process. "Paddle / torch" is a ratio of times: above 1, Paddle's kernel is slower. torch is skipped, with a note,
where it is not installed. The operations our kernels replace (alignment/cpu_kernels' C++ operators, built here if
this machine has a C++ compiler) also time the kernel, alternating with the other two, forward + backward where the
row says so; the Paddle column is then the composition the model runs without them, called directly.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from typing import Callable, Dict, List, Optional, Tuple

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if not __package__:  # run as a script from a checkout: make `alignment` and `benchmarks` importable
    sys.path.insert(0, ROOT)

from alignment.cpu_env import (apply_cpu_defaults, cpuinfo_fields, describe_machine, machine_facts,  # noqa: E402
                                usable_cores)

apply_cpu_defaults()

# OpenMP / MKL worker threads spin for up to 200 ms after their last parallel region (KMP_BLOCKTIME): each block
# of calls waits that out, so neither library is timed against the other's spinning threads
SETTLE_S, ROUNDS = 0.5, 3
TOKENS, HIDDEN, INTER, HEADS, SEQ, VOCAB, EPS = 1024, 576, 1536, 9, 128, 49152, 1e-5
LAYERS, KV_WIDTH, HEAD_DIM = 30, 192, 64  # SmolLM2's layers, its k / v projections' width (3 heads) and head size


def operations(paddle, torch, kernels: Optional[Dict[str, Callable]] = None, score_layers: int = LAYERS
               ) -> Dict[str, Tuple[str, Callable, Callable]]:
    """name -> (shape, Paddle call, torch call) over the same random numbers (torch None: no torch calls); for the
    operations our kernels replace, `kernels` (when given) receives name -> our kernel's call. score_layers: the
    layers of the scoring pass's GEMMs (fewer: a quicker test of the same calls)."""
    import numpy as np
    import paddle.nn.functional as F
    from paddle.incubate.nn.functional import fused_rms_norm

    from alignment.models.llama import RMSNorm

    rng = np.random.default_rng(0)

    def pair(*shape):
        a = rng.standard_normal(shape).astype("float32")
        return paddle.to_tensor(a), torch.from_numpy(a) if torch else None

    x, tx = pair(TOKENS, HIDDEN)
    w, tw = pair(HIDDEN, INTER)
    act, tact = pair(TOKENS, INTER)
    act2, tact2 = pair(TOKENS, INTER)
    emb, temb = pair(HIDDEN, VOCAB)
    logits, tlogits = pair(TOKENS, VOCAB)
    scores, tscores = pair(8, HEADS, SEQ, SEQ)
    ids = rng.integers(0, VOCAB, [TOKENS])
    pids, tids = paddle.to_tensor(ids), torch.from_numpy(ids) if torch else None
    norm = RMSNorm(HIDDEN, EPS)
    tnorm_w = torch.ones(HIDDEN) if torch else None

    def torch_rms(h):  # transformers' LlamaRMSNorm
        return tnorm_w * (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + EPS))

    tF = torch.nn.functional if torch else None
    ops = {
        "GEMM (MLP up)": (f"{TOKENS}x{HIDDEN} @ {HIDDEN}x{INTER}", lambda: paddle.matmul(x, w),
                          lambda: torch.matmul(tx, tw)),
        "GEMM (LM head)": (f"{TOKENS}x{HIDDEN} @ {HIDDEN}x{VOCAB}", lambda: paddle.matmul(x, emb),
                           lambda: torch.matmul(tx, temb)),
        "token log-probs over the vocabulary": (
            f"{TOKENS}x{VOCAB}", lambda: -F.cross_entropy(logits, pids.unsqueeze(-1), reduction="none"),
            lambda: -tF.cross_entropy(tlogits, tids, reduction="none")),
        "exp": (f"{TOKENS}x{VOCAB}", lambda: paddle.exp(logits), lambda: torch.exp(tlogits)),
        "row max": (f"{TOKENS}x{VOCAB}", lambda: logits.max(-1), lambda: tlogits.max(-1)),
        "row sum": (f"{TOKENS}x{VOCAB}", lambda: logits.sum(-1), lambda: tlogits.sum(-1)),
        "attention softmax": (f"8x{HEADS}x{SEQ}x{SEQ}", lambda: F.softmax(scores, -1),
                              lambda: torch.softmax(tscores, -1)),
        "silu": (f"{TOKENS}x{INTER}", lambda: F.silu(act), lambda: tF.silu(tact)),
        "multiply": (f"{TOKENS}x{INTER}", lambda: act * act2, lambda: tact * tact2),
        "add": (f"{TOKENS}x{INTER}", lambda: act + act2, lambda: tact + tact2),
        "SwiGLU, silu(gate) * up": (f"{TOKENS}x{INTER}", lambda: F.silu(act) * act2, lambda: tF.silu(tact) * tact2),
        "SwiGLU, Paddle's fused swiglu": (f"{TOKENS}x{INTER}", lambda: F.swiglu(act, act2),
                                          lambda: tF.silu(tact) * tact2),
        "RMSNorm (ours)": (f"{TOKENS}x{HIDDEN}", lambda: norm(x), lambda: torch_rms(tx)),
    }
    if "avx512f" in cpuinfo_fields().get("flags", "").split():  # its CPU kernel (RmsNormAvxKernel) is AVX-512 code:
        # SIGILL on an AVX2-only CPU (AMD EPYC Zen 3)
        ops["RMSNorm, Paddle's fused_rms_norm (no backward on CPU)"] = (
            f"{TOKENS}x{HIDDEN}", lambda: fused_rms_norm(x, norm.weight, None, EPS, 1), lambda: torch_rms(tx))
    ops[f"a scoring pass's GEMMs ({score_layers} layers, LM head)"] = score_gemms(paddle, torch, rng, score_layers)
    for name, (shape, ours, theirs, kernel) in kernel_operations(paddle, torch, pair, pids, tids).items():
        ops[name] = (shape, ours, theirs)  # the forward rows keep their place
        if kernels is not None:
            kernels[name] = kernel
    return ops


def kernel_operations(paddle, torch, pair, pids, tids) -> Dict[str, tuple]:
    """Our kernels (alignment/cpu_kernels): name -> (shape, Paddle's composition, torch, our kernel), the forward rows
    of `operations` and forward + backward of each, the calls returning what the tests compare (an output or the
    first input's gradient); {} where the library cannot be built."""
    import numpy as np
    import paddle.nn.functional as F
    from paddle import _C_ops

    from alignment.cpu_kernels import build, threads
    from alignment.models.rope import apply_rope, rotate_half_matrix

    lib = build.load_kernels()
    if lib is None:
        return {}
    n = threads()
    tF = torch.nn.functional if torch else None

    def leaves(*shape):
        p, t = pair(*shape)
        p.stop_gradient = False
        return p, t.requires_grad_() if torch else None

    logits, tlogits = leaves(TOKENS, VOCAB)
    x, tx = leaves(TOKENS, HIDDEN)
    w, tw = leaves(HIDDEN)
    gate, tgate = leaves(TOKENS, INTER)
    up, tup = leaves(TOKENS, INTER)
    scores, tscores = leaves(8, HEADS, SEQ, SEQ)
    causal = np.broadcast_to(np.triu(np.full([SEQ, SEQ], -1e9, "float32"), 1), [8, HEADS, SEQ, SEQ]).copy()
    bias, tbias = paddle.to_tensor(causal), torch.from_numpy(causal) if torch else None
    d = HIDDEN // HEADS
    q, tq = leaves(8, SEQ, HEADS, d)  # a projection's output, [b, s, h, d]
    angles = np.arange(SEQ)[:, None] * (10000.0 ** (-np.arange(0, d, 2) / d))[None]  # [s, d/2]
    tables = [np.concatenate([f(angles)] * 2, -1).astype("float32") for f in (np.cos, np.sin)]  # [s, d]
    cos, sin = (paddle.to_tensor(np.broadcast_to(t[None, :, None], [8, SEQ, HEADS, d]).copy()) for t in tables)
    tcos, tsin = (torch.from_numpy(t[None, None]) if torch else None for t in tables)  # [1, 1, s, d], broadcast
    rotate = rotate_half_matrix(d, paddle.float32)

    def rope(a):  # llama.py's composition: rope.py apply_rope, then to head-major
        return apply_rope(a, cos, sin, rotate).transpose([0, 2, 1, 3])

    def trope(a):  # transformers' apply_rotary_pos_emb on the head-major view
        a = a.transpose(1, 2)
        return a * tcos + torch.cat([-a[..., d // 2:], a[..., :d // 2]], -1) * tsin

    def back(leaf, out):  # -> the leaf's gradient of out.sum()
        leaf.clear_gradient()
        out.sum().backward()
        return leaf.grad

    def tback(leaf, out):
        leaf.grad = None
        out.sum().backward()
        return leaf.grad

    def nll(z):  # [N, 1]: what F.cross_entropy runs
        return _C_ops.cross_entropy_with_softmax(z, pids.unsqueeze(-1), False, True, True, -100, -1)[1]

    def rms(a, b):  # RMSNorm.forward's composition
        normed = a * paddle.rsqrt(paddle.square(a).mean(axis=-1, keepdim=True) + EPS)
        return normed * paddle.expand(b, normed.shape)

    def trms(a, b):  # transformers' LlamaRMSNorm
        return b * (a * torch.rsqrt(a.pow(2).mean(-1, keepdim=True) + EPS))

    def t_nll(z):
        return tF.cross_entropy(z, tids, reduction="none")

    lp, nm, sw, at = f"{TOKENS}x{VOCAB}", f"{TOKENS}x{HIDDEN}", f"{TOKENS}x{INTER}", f"8x{HEADS}x{SEQ}x{SEQ}"
    qs = f"8x{SEQ}x{HEADS}x{d}"
    decode = decode_gemms(paddle, torch, lib, n)
    return {
        f"decode weight GEMMs from memory, {decode[0]} weights": decode[1:],
        "token log-probs over the vocabulary": (
            lp, lambda: nll(logits.detach()), lambda: t_nll(tlogits.detach()),
            lambda: -lib.alignment_token_logprobs(logits.detach(), pids, n)[0]),
        "token log-probs, forward + backward": (
            lp, lambda: back(logits, nll(logits)), lambda: tback(tlogits, t_nll(tlogits)),
            lambda: back(logits, -lib.alignment_token_logprobs(logits, pids, n)[0])),
        "SwiGLU, silu(gate) * up": (
            sw, lambda: F.silu(gate.detach()) * up.detach(), lambda: tF.silu(tgate.detach()) * tup.detach(),
            lambda: lib.alignment_swiglu(gate.detach(), up.detach(), n)),
        "SwiGLU, forward + backward": (
            sw, lambda: back(gate, F.silu(gate) * up), lambda: tback(tgate, tF.silu(tgate) * tup),
            lambda: back(gate, lib.alignment_swiglu(gate, up, n))),
        "RMSNorm (ours)": (
            nm, lambda: rms(x.detach(), w.detach()), lambda: trms(tx.detach(), tw.detach()),
            lambda: lib.alignment_rms_norm(x.detach(), w.detach(), EPS, n)[0]),
        "RMSNorm, forward + backward": (
            nm, lambda: back(x, rms(x, w)), lambda: tback(tx, trms(tx, tw)),
            lambda: back(x, lib.alignment_rms_norm(x, w, EPS, n)[0])),
        "attention softmax": (  # the causal mask added first, as the model (and transformers' eager attention)
            at, lambda: F.softmax(scores.detach() + bias, -1), lambda: torch.softmax(tscores.detach() + tbias, -1),
            lambda: lib.alignment_attention_softmax(scores.detach(), bias, n)),
        "attention softmax, forward + backward": (
            at, lambda: back(scores, F.softmax(scores + bias, -1)), lambda: tback(tscores, torch.softmax(
                tscores + tbias, -1)), lambda: back(scores, lib.alignment_attention_softmax(scores, bias, n))),
        "RoPE on q, to head-major": (
            qs, lambda: rope(q.detach()), lambda: trope(tq.detach()),
            lambda: lib.alignment_rope(q.detach(), cos, sin, False, n)),
        "RoPE on q, forward + backward": (
            qs, lambda: back(q, rope(q)), lambda: tback(tq, trope(tq)),
            lambda: back(q, lib.alignment_rope(q, cos, sin, False, n))),
    }


def score_gemms(paddle, torch, rng, layer_count: int) -> tuple:
    """(shape, Paddle call, torch call) of a scoring pass's GEMMs at bench_smollm2's score workload: per layer q, k,
    v, o, gate, up and down over the layer's own weights (Paddle x @ W [in, out], as our Linear; torch F.linear over
    [out, in], as transformers'), attention's q k^T and p v over every head (k and v repeated to the query heads, as
    our model does), then the tied LM head on the 8 x 127 positions token log-probs take. What the pass costs with
    nothing but its GEMMs: the score workload's lead over transformers' is at most (this row's torch time plus
    transformers' time outside its GEMMs) / this row's Paddle time."""
    import numpy as np

    def weight(fan_in, fan_out):
        a = rng.standard_normal([fan_in, fan_out]).astype("float32") / fan_in ** 0.5
        return paddle.to_tensor(a), torch.from_numpy(np.ascontiguousarray(a.T)) if torch else None

    widths = [(HIDDEN, HIDDEN), (HIDDEN, KV_WIDTH), (HIDDEN, KV_WIDTH), (HIDDEN, HIDDEN), (HIDDEN, INTER),
              (HIDDEN, INTER), (INTER, HIDDEN)]  # q, k, v, o, gate, up, down
    layers = [[weight(*w) for w in widths] for _ in range(layer_count)]
    inputs = {k: rng.standard_normal([TOKENS, k]).astype("float32") for k in (HIDDEN, INTER)}
    heads = rng.standard_normal([2, TOKENS // SEQ, HEADS, SEQ, HEAD_DIM]).astype("float32")  # q, k (= v)
    probs = rng.standard_normal([TOKENS // SEQ, HEADS, SEQ, SEQ]).astype("float32")
    head_rows = rng.standard_normal([TOKENS - TOKENS // SEQ, HIDDEN]).astype("float32")
    table = rng.standard_normal([VOCAB, HIDDEN]).astype("float32")
    p_in = {k: paddle.to_tensor(a) for k, a in inputs.items()}
    p_heads, p_probs, p_rows, p_table = (paddle.to_tensor(a) for a in (heads, probs, head_rows, table))

    def ours():
        for layer in layers:
            for (w, _), (fan_in, _) in zip(layer, widths):
                paddle.matmul(p_in[fan_in], w)
            paddle.matmul(p_heads[0], p_heads[1], transpose_y=True)
            paddle.matmul(p_probs, p_heads[1])
        return paddle.matmul(p_rows, p_table, transpose_y=True)

    if not torch:
        return f"{TOKENS} tokens, SmolLM2", ours, None
    t_in = {k: torch.from_numpy(a) for k, a in inputs.items()}
    t_heads, t_probs, t_rows, t_table = (torch.from_numpy(a) for a in (heads, probs, head_rows, table))

    def theirs():
        for layer in layers:
            for (_, w), (fan_in, _) in zip(layer, widths):
                torch.nn.functional.linear(t_in[fan_in], w)
            torch.matmul(t_heads[0], t_heads[1].transpose(-1, -2))
            torch.matmul(t_probs, t_heads[1])
        return torch.nn.functional.linear(t_rows, t_table)

    return f"{TOKENS} tokens, SmolLM2", ours, theirs


def decode_gemms(paddle, torch, lib, threads: int) -> tuple:
    """(weight count, shape, Paddle's matmul, torch's linear, our decode GEMM kernel) of a decode step's 8 rows
    times [576, 1536] weights, as many as fill twice the last-level cache (alignment/cpu_kernels/choice.py: a real
    model's weights come from memory), each call running all of them and returning the last product. torch holds
    each weight as transformers' Linear does ([out, in]); ours packed into the kernel's panels."""
    import numpy as np

    from alignment.cpu_kernels.choice import DECODE_ROWS, decode_weight_count

    count = decode_weight_count(HIDDEN, INTER)
    rng = np.random.default_rng(1)
    base = rng.standard_normal([HIDDEN, INTER]).astype("float32") / HIDDEN ** 0.5
    x = rng.standard_normal([DECODE_ROWS, 1, HIDDEN]).astype("float32")
    arrays = [base * (1 + i / count) for i in range(count)]  # [K, N] each
    weights = [paddle.to_tensor(a) for a in arrays]
    panels = [lib.alignment_pack_panels(w, False, threads) for w in weights]
    tweights = [torch.from_numpy(np.ascontiguousarray(a.T)) for a in arrays] if torch else []
    px, tx = paddle.to_tensor(x), torch.from_numpy(x) if torch else None

    def run(fn, items):
        for item in items:
            out = fn(item)
        return out

    return (count, f"{DECODE_ROWS}x{HIDDEN}x{INTER}", lambda: run(lambda w: paddle.matmul(px, w), weights),
            lambda: run(lambda w: torch.nn.functional.linear(tx, w), tweights),
            lambda: run(lambda p: lib.alignment_panel_matmul(px, p, INTER, threads), panels))


def once_ms(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return (time.perf_counter() - start) * 1e3


def measure(repeats: int) -> List[dict]:
    import paddle

    try:
        import torch

        torch.set_num_threads(usable_cores())
    except ImportError:
        torch = None
        print("torch is not installed: Paddle's times only", file=sys.stderr)
    rows, kernel_calls = [], {}
    for name, (shape, ours, theirs) in operations(paddle, torch, kernel_calls).items():
        kernel = [kernel_calls[name]] if name in kernel_calls else []
        sides = {"paddle_ms": ours, **({"torch_ms": theirs} if torch else {}), **({"kernel_ms": kernel[0]} if kernel
                                                                                  else {})}
        times = {key: [] for key in sides}
        for _ in range(ROUNDS):  # blocks of calls, alternating, each after the other sides' threads went idle
            for key, fn in sides.items():
                time.sleep(SETTLE_S)
                fn()
                times[key] += [once_ms(fn) for _ in range(repeats)]
        row = {"operation": name, "shape": shape, **{key: statistics.median(t) for key, t in times.items()}}
        if torch:
            row["paddle_over_torch"] = row["paddle_ms"] / row["torch_ms"]
        if kernel:
            row["kernel_over_paddle"] = row["kernel_ms"] / row["paddle_ms"]
            if torch:
                row["kernel_over_torch"] = row["kernel_ms"] / row["torch_ms"]
        rows.append(row)
    return rows

def main(argv=None) -> None:
    from benchmarks import record

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=9)
    record.add_arguments(parser)
    args = parser.parse_args(argv)
    print(describe_machine(machine_facts()))
    rows = measure(args.repeats)
    print("| operation | shape | Paddle ms | torch ms | Paddle / torch | our kernel ms | kernel / Paddle | "
          "kernel / torch |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        theirs = f"{r['torch_ms']:.2f} | {r['paddle_over_torch']:.2f}x" if "torch_ms" in r else "- | -"
        kernel = "- | - | -"
        if "kernel_ms" in r:
            versus_torch = f"{r['kernel_over_torch']:.2f}x" if "kernel_over_torch" in r else "-"
            kernel = f"{r['kernel_ms']:.2f} | {r['kernel_over_paddle']:.2f}x | {versus_torch}"
        print(f"| {r['operation']} | {r['shape']} | {r['paddle_ms']:.2f} | {theirs} | {kernel} |")
    if not args.no_save:
        record.save("cpu_ops", {"threads": usable_cores(), "rows": rows}, record.results_dir(args),
                    machine=machine_facts())


if __name__ == "__main__":
    main()
