"""This machine's limits, measured, and each SmolLM2-135M phase as a fraction of its limit.

    python benchmarks/bench_machine_limits.py [--model DIR] [--repeats 5] [--json out.json] [--decode-only]

Limits: the fp32 GEMM peak (Paddle's matmul and numpy's BLAS at the shapes SmolLM2's training and scoring run:
1024 tokens x 576 against 576 x 1536, 576 x 576, 1536 x 576 and the 576 x 49152 LM head) and the memory bandwidth
(a STREAM triad a = b + s * c over 3 x 256 MB arrays, numpy and Paddle; bytes counted as STREAM does, 3 per element
x 4 B). Phases (benchmarks/bench_smollm2.py's workloads on our model): train_step and score as FLOP/s (6 and 2 x
parameters x tokens, plus attention) against the best GEMM peak; greedy decode at batch 8 as tokens/s against the
bandwidth bound, batch x bandwidth / (bytes of the fp32 weights + the KV cache read per step). Medians of
--repeats; the CPU and ISA are printed with the figures; every figure is a ratio measured in the same run.
--decode-only: the triad and greedy decoding only, through generate's FusedDecoder and through the model's layers
(`fused=False`) alternating, each against the same bound.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from alignment.cpu_env import apply_cpu_defaults, describe_machine, machine_facts  # noqa: E402

apply_cpu_defaults()

import bench_smollm2 as smol  # noqa: E402

TOKENS = 1024
SHAPES = [(TOKENS, 576, 1536), (TOKENS, 576, 576), (TOKENS, 1536, 576), (TOKENS, 576, 49152)]
TRIAD_ELEMENTS = 64 * 1024 * 1024  # 256 MB per float32 array


def median_seconds(fn, repeats: int) -> float:
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def gemm_peaks(repeats: int) -> dict:
    import numpy as np
    import paddle

    out = {}
    for m, k, n in SHAPES:
        a, b = np.random.rand(m, k).astype("float32"), np.random.rand(k, n).astype("float32")
        pa, pb = paddle.to_tensor(a), paddle.to_tensor(b)
        flops = 2.0 * m * k * n
        out[f"{m}x{k}x{n}"] = {"paddle_gflops": flops / median_seconds(lambda: paddle.matmul(pa, pb).numpy(),
                                                                        repeats) / 1e9,
                               "numpy_gflops": flops / median_seconds(lambda: a @ b, repeats) / 1e9}
    return out


def triad(repeats: int) -> dict:
    import numpy as np
    import paddle

    b, c = np.random.rand(TRIAD_ELEMENTS).astype("float32"), np.random.rand(TRIAD_ELEMENTS).astype("float32")
    a = np.empty_like(b)

    def numpy_triad():
        np.multiply(c, np.float32(3.0), out=a)
        np.add(a, b, out=a)

    pb, pc = paddle.to_tensor(b), paddle.to_tensor(c)
    moved = 3 * 4 * TRIAD_ELEMENTS
    return {"numpy_gb_s": moved / median_seconds(numpy_triad, repeats) / 1e9,
            "paddle_gb_s": moved / median_seconds(lambda: (pb + 3.0 * pc)._clear_data(), repeats) / 1e9}


def model_flops(config, tokens: int, seq: int, factor: int) -> float:
    """factor x parameters x tokens plus the attention scores and values (2 x 2 x s x h per token and layer)."""
    params = sum(int(p.size) for p in config["params"])
    attention = 4 * seq * config["hidden"] * config["layers"] * tokens
    return factor * params * tokens + factor / 2 * attention


def decode_bound(model, bandwidth_gb_s: float) -> float:
    """Greedy decode's tokens/s if every step read the fp32 weights and the mean KV cache once at this bandwidth."""
    cfg = model.config
    weight_bytes = 4 * sum(int(p.size) for p in model.parameters())
    kv_bytes = 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * (cfg.hidden_size // cfg.num_attention_heads) * 4
    mean_context = smol.PROMPT + smol.NEW_TOKENS / 2
    return smol.BATCH * bandwidth_gb_s * 1e9 / (weight_bytes + smol.BATCH * mean_context * kv_bytes)


def decode_only(args) -> dict:
    """The bound and greedy decoding through FusedDecoder and through the model's layers, alternating call by
    call (medians of --repeats each), so the two figures share the machine's state."""
    bandwidth = max(triad(args.repeats).values())
    ours = smol.Ours(smol.ensure_checkpoint(args.model))
    bound = decode_bound(ours.model, bandwidth)
    paths = {"fused": lambda: ours.generate(fused=True), "layers": lambda: ours.generate(fused=False)}
    times = {name: [] for name in paths}
    for fn in paths.values():
        fn()  # warm-up
    for _ in range(args.repeats):
        for name, fn in paths.items():
            start = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - start)
    tokens_s = {name: smol.BATCH * smol.NEW_TOKENS / statistics.median(t) for name, t in times.items()}
    print(f"triad {bandwidth:.1f} GB/s; bandwidth bound {bound:.1f} tokens/s (batch {smol.BATCH})")
    for name, rate in tokens_s.items():
        print(f"decode {name}: {rate:.1f} tokens/s = {rate / bound:.0%} of the bound")
    print(f"fused / layers: {tokens_s['fused'] / tokens_s['layers']:.2f}x")
    result = {"machine": machine_facts(), "triad_gb_s": bandwidth, "decode_bound_tokens_s": bound,
              "decode_tokens_s": tokens_s, "decode_of_bound": {n: r / bound for n, r in tokens_s.items()},
              "seconds": times}
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(result, f, indent=2)
    print("RESULT " + json.dumps(result))
    return result


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    parser.add_argument("--model", default=smol.DEFAULT_MODEL)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--json", default=None)
    parser.add_argument("--decode-only", action="store_true",
                        help="only the bandwidth and greedy decoding, fused decoder and model layers alternating")
    args = parser.parse_args(argv)
    print(describe_machine(machine_facts()))
    if args.decode_only:
        return decode_only(args)
    gemm = gemm_peaks(args.repeats)
    peak = max(max(v.values()) for v in gemm.values())
    bandwidth = max(triad(args.repeats).values())
    ours = smol.Ours(smol.ensure_checkpoint(args.model))
    cfg = ours.model.config
    shape = {"params": list(ours.model.parameters()), "hidden": cfg.hidden_size, "layers": cfg.num_hidden_layers}
    seconds = {name: median_seconds(getattr(ours, name), args.repeats) for name in ("train_step", "score",
                                                                                   "generate")}
    tokens = smol.BATCH * smol.SEQ
    train_gflops = model_flops(shape, tokens, smol.SEQ, 6) / seconds["train_step"] / 1e9
    score_gflops = model_flops(shape, tokens, smol.SEQ, 2) / seconds["score"] / 1e9
    bound = decode_bound(ours.model, bandwidth)
    decode = smol.BATCH * smol.NEW_TOKENS / seconds["generate"]
    result = {"machine": machine_facts(), "gemm_gflops": gemm, "gemm_peak_gflops": peak,
              "triad_gb_s": bandwidth, "train_gflops": train_gflops, "train_of_peak": train_gflops / peak,
              "score_gflops": score_gflops, "score_of_peak": score_gflops / peak, "decode_tokens_s": decode,
              "decode_bound_tokens_s": bound, "decode_of_bound": decode / bound}
    print(f"GEMM peak {peak:.0f} GFLOP/s; triad {bandwidth:.1f} GB/s")
    print(f"train_step {train_gflops:.0f} GFLOP/s = {train_gflops / peak:.0%} of the GEMM peak; score "
          f"{score_gflops:.0f} GFLOP/s = {score_gflops / peak:.0%}")
    print(f"decode (batch {smol.BATCH}) {decode:.1f} tokens/s = {decode / bound:.0%} of the bandwidth bound "
          f"{bound:.1f} tokens/s")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(result, f, indent=2)
    print("RESULT " + json.dumps(result))
    return result


if __name__ == "__main__":
    main()
