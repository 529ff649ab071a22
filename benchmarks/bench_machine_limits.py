"""This machine's limits, measured, and each SmolLM2-135M phase as a fraction of its limit.

    python benchmarks/bench_machine_limits.py [--model DIR] [--repeats 5] [--json out.json] [--decode-only]

Limits: the fp32 GEMM peak (Paddle's matmul and numpy's BLAS at the shapes SmolLM2's training and scoring run:
1024 tokens x 576 against 576 x 1536, 576 x 576, 1536 x 576 and the 576 x 49152 LM head, into reused output
buffers) and the memory bandwidth (STREAM's triad a = b + s * c over 3 x 256 MB arrays in one pass, numpy on one
thread per usable core, and Paddle's one-op a = b + c; bytes counted as STREAM does, 3 per element x 4 B; measured
before and after the workloads, the largest figure taken). Phases
(benchmarks/bench_smollm2.py's workloads on our model): train_step and score as FLOP/s (6 and 2 x parameters x
tokens, plus attention) against the best GEMM peak; greedy generation at batch 8 split into its prompt pass (a
call with one new token; FLOP/s against the GEMM peak) and its decode steps (the rest of the call; tokens/s
against the bandwidth bound, batch x bandwidth / (bytes of the fp32 weights + the KV cache read per step)), and
the whole call against the sum of those two bounds. Medians of --repeats, each workload first called until a
call faults in no new memory page (`settle`: the heap's steady state, which a training run reaches in its first
few steps); the CPU and ISA are printed with the figures; every figure is a ratio measured in the same run.
--decode-only: the bandwidth and greedy decoding only, through generate's FusedDecoder and through the model's
layers (`fused=False`) alternating with the prompt pass alone, each against the same bound.
Ceilings (both modes; the training and scoring ones in the full run only): the same phases reduced to their GEMMs
on random inputs: a decode step's weight GEMMs at batch 8 over the FusedDecoder's weights, one call each (Paddle's
matmul, or our decode GEMM kernel where the decoder packed them: where alignment/cpu_kernels chose that kernel or the
decode layer kernel, which runs the same panel loops inside one call per layer), against the bandwidth bound, a
training step's forward and backward GEMMs (projections, the LM head, attention's products) against the GEMM peak,
and a scoring pass's forward GEMMs, also as a share of the score workload's time (the rest is everything else). No
arrangement of Paddle calls takes a phase past its ceiling; a target above it needs faster kernels, not fewer calls
(the decode layer kernel, which calls nothing per GEMM, can pass the decode ceiling).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import resource
import statistics
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from alignment.cpu_env import apply_cpu_defaults, describe_machine, machine_facts, usable_cores  # noqa: E402

apply_cpu_defaults()

import bench_smollm2 as smol  # noqa: E402

TOKENS = 1024
SHAPES = [(TOKENS, 576, 1536), (TOKENS, 576, 576), (TOKENS, 1536, 576), (TOKENS, 576, 49152)]
TRIAD_ELEMENTS = 64 * 1024 * 1024  # 256 MB per float32 array
TRIAD_CHUNK = 64 * 1024  # 256 KB: a chunk of s * c stays in L2


SETTLE_CALLS = 10  # at most this many warm-up calls of a workload (settle)


def minor_faults() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def settle(fn, limit: int = SETTLE_CALLS, faults=minor_faults) -> int:
    """Warm-up calls of `fn` until one faults in no new page (at most `limit`); returns how many ran. With
    ALIGNMENT_MALLOC=heap the heap grows over a workload's first calls until its free chunks fit every buffer:
    a SmolLM2 training step faulted in 750k, 495k, 74k, 49k and 49k pages on its first five calls (3.4, 4.4, 3.5,
    3.2, 3.2 s) and none from the sixth on (2.7 s), the state a training run spends its steps in."""
    for calls in range(1, limit + 1):
        before = faults()
        fn()
        if faults() == before:
            return calls
    return limit


def median_seconds(fn, repeats: int, warm: bool = False) -> float:
    """Median of `repeats` timed calls, after one untimed call unless `warm` (already warmed up, e.g. by settle)."""
    if not warm:
        fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def gemm_peaks(repeats: int) -> dict:
    """GFLOP/s of one matmul per SmolLM2 shape; outputs are written into buffers reused from call to call (numpy's
    `out=`, Paddle's from the heap allocator), so no call pays for copying or first-touching its result."""
    import numpy as np
    import paddle

    out = {}
    for m, k, n in SHAPES:
        a, b = np.random.rand(m, k).astype("float32"), np.random.rand(k, n).astype("float32")
        c = np.empty((m, n), dtype="float32")
        pa, pb = paddle.to_tensor(a), paddle.to_tensor(b)
        flops = 2.0 * m * k * n
        out[f"{m}x{k}x{n}"] = {"paddle_gflops": flops / median_seconds(lambda: paddle.matmul(pa, pb), repeats) / 1e9,
                               "numpy_gflops": flops / median_seconds(lambda: np.matmul(a, b, out=c), repeats) / 1e9}
    return out


def stream_triad(a, b, c, threads: int) -> None:
    """a = b + 3 * c over float32 numpy arrays in one pass over memory: `threads` threads (numpy releases the GIL)
    each over its part, in L2-sized chunks so that a chunk's 3 * c stays in cache."""
    import threading

    import numpy as np

    part = -(-len(a) // threads)

    def run(start: int, stop: int) -> None:
        scaled = np.empty(TRIAD_CHUNK, dtype=a.dtype)
        for lo in range(start, stop, TRIAD_CHUNK):
            hi = min(lo + TRIAD_CHUNK, stop)
            np.multiply(c[lo:hi], a.dtype.type(3.0), out=scaled[:hi - lo])
            np.add(b[lo:hi], scaled[:hi - lo], out=a[lo:hi])

    workers = [threading.Thread(target=run, args=(i * part, min((i + 1) * part, len(a)))) for i in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()


def bandwidth(repeats: int) -> dict:
    """Memory bandwidth in GB/s, bytes counted as STREAM does (read b and c, write a: 3 x 4 B per element, no
    write-allocate traffic): numpy's one-pass triad on one thread per usable core (stream_triad), and Paddle's
    one-op a = b + c. A whole-array b + 3 * c would be two passes, 5 x 4 B per element."""
    import numpy as np
    import paddle

    b, c = np.random.rand(TRIAD_ELEMENTS).astype("float32"), np.random.rand(TRIAD_ELEMENTS).astype("float32")
    a = np.empty_like(b)
    pb, pc = paddle.to_tensor(b), paddle.to_tensor(c)
    moved = 3 * 4 * TRIAD_ELEMENTS
    return {"numpy_triad_gb_s": moved / median_seconds(lambda: stream_triad(a, b, c, usable_cores()), repeats) / 1e9,
            "paddle_add_gb_s": moved / median_seconds(lambda: paddle.add(pb, pc)._clear_data(), repeats) / 1e9}


def best_bandwidth(before: dict, after: dict) -> tuple:
    """(the largest figure, a printable line) of bandwidth() run before and after the workloads: on this VM a
    single measurement has come out at half the machine's usual bandwidth."""
    best = max(max(before.values()), max(after.values()))
    runs = "; ".join(f"{when}: " + ", ".join(f"{k} {v:.1f}" for k, v in run.items())
                     for when, run in (("before", before), ("after", after)))
    return best, f"memory bandwidth {best:.1f} GB/s ({runs})"


def model_flops(config, tokens: int, seq: int, factor: int) -> float:
    """factor x parameters x tokens plus the attention scores and values (2 x 2 x s x h per token and layer)."""
    params = sum(int(p.size) for p in config["params"])
    attention = 4 * seq * config["hidden"] * config["layers"] * tokens
    return factor * params * tokens + factor / 2 * attention


def decode_bound(model, bandwidth_gb_s: float) -> float:
    """A decode step's tokens/s if it read the fp32 weights and the mean KV cache once at this bandwidth."""
    cfg = model.config
    weight_bytes = 4 * sum(int(p.size) for p in model.parameters())
    kv_bytes = 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * (cfg.hidden_size // cfg.num_attention_heads) * 4
    mean_context = smol.PROMPT + smol.NEW_TOKENS / 2
    return smol.BATCH * bandwidth_gb_s * 1e9 / (weight_bytes + smol.BATCH * mean_context * kv_bytes)


def run_matmuls(calls) -> None:
    """One paddle.matmul per (a, b, transpose_x, transpose_y) in `calls`, in order, recording no gradients."""
    import paddle

    with paddle.no_grad():
        for a, b, tx, ty in calls:
            paddle.matmul(a, b, transpose_x=tx, transpose_y=ty)


def decode_gemms(model, batch: int) -> list:
    """The weight GEMMs of one FusedDecoder step at `batch` rows as the decoder runs them (fused_decode.matmul:
    Paddle's matmul, or the decode GEMM kernel over its panels), over the weights it holds (q | k | v, o, gate, up
    and down per layer, then the LM head); inputs [batch, 1, K] of random numbers -> calls for run_decode_gemms."""
    import paddle

    from alignment.models.fused_decode import FusedDecoder, Panels

    with paddle.no_grad():
        decoder = FusedDecoder(model, batch)  # weights only: no step is taken
    weights = [w for layer in decoder.layers for w in (layer.qkv, layer.o, layer.gate, layer.up, layer.down)]
    weights += decoder.head_slices
    fan_in = [int(w.packed.shape[1] if isinstance(w, Panels) else w.shape[0]) for w in weights]
    inputs = {k: paddle.rand([batch, 1, k]) for k in set(fan_in)}
    return [(inputs[k], w) for k, w in zip(fan_in, weights)]


def run_decode_gemms(calls) -> None:
    import paddle

    from alignment.models.fused_decode import matmul

    with paddle.no_grad():
        for x, weight in calls:
            matmul(x, weight)


def train_gemms(model, batch: int, seq: int, backward: bool = True) -> tuple:
    """(calls, FLOPs) of a training step's GEMMs on [batch, seq] tokens: every projection forward (x @ W) and
    backward (dY @ W^T, X^T @ dY) over the model's own weights, the LM head on seq - 1 positions as
    token_log_probs takes them (tied: against the embedding, transpose_y), and per layer attention's q @ k^T and
    p @ v with their four backward products; random inputs, one tensor per shape. backward=False: the forward
    products only (a scoring pass's GEMMs)."""
    import paddle

    cfg, tokens = model.config, batch * seq
    d = cfg.hidden_size // cfg.num_attention_heads
    cache: dict = {}

    def rand(*shape):
        return cache.setdefault(shape, paddle.rand(list(shape)))

    calls = []
    for layer in model.model.layers:
        attn, mlp = layer.self_attn, layer.mlp
        for lin in (attn.q_proj, attn.k_proj, attn.v_proj, attn.o_proj, mlp.gate_proj, mlp.up_proj, mlp.down_proj):
            k, n = lin.weight.shape
            calls += [(rand(tokens, k), lin.weight, False, False)]
            calls += [(rand(tokens, n), lin.weight, False, True), (rand(tokens, k), rand(tokens, n), True, False)
                      ] if backward else []
        q, s = rand(batch, cfg.num_attention_heads, seq, d), rand(batch, cfg.num_attention_heads, seq, seq)
        calls += [(q, q, False, True), (s, q, False, False)]  # scores, out
        calls += [(s, q, False, False), (s, q, True, False),  # d scores @ k -> dq, d scores^T @ q -> dk
                  (q, q, False, True), (s, q, True, False)  # d out @ v^T -> d probs, probs^T @ d out -> dv
                  ] if backward else []
    head = model.model.embed_tokens.weight if cfg.tie_word_embeddings else model.lm_head.weight
    rows, tied = batch * (seq - 1), cfg.tie_word_embeddings
    hidden, grad = rand(rows, cfg.hidden_size), rand(rows, cfg.vocab_size)
    calls += [(hidden, head, False, tied)]
    calls += [(grad, head, False, not tied), (grad, hidden, True, False) if tied else (hidden, grad, True, False)
              ] if backward else []
    flops = 0.0
    for a, b, tx, ty in calls:
        m, k = (a.shape[-1], a.shape[-2]) if tx else (a.shape[-2], a.shape[-1])
        n = b.shape[-2] if ty else b.shape[-1]
        flops += 2.0 * m * k * n * math.prod(a.shape[:-2])
    return calls, flops


def prompt_flops(model) -> float:
    """generate's prompt pass: 2 x the decoder's parameters x prompt tokens plus attention, and the LM head at each
    row's last position only (last_only)."""
    cfg = model.config
    head = cfg.vocab_size * cfg.hidden_size
    decoder = sum(int(p.size) for p in model.parameters()) - head * (1 if cfg.tie_word_embeddings else 2)
    tokens = smol.BATCH * smol.PROMPT
    attention = 4 * smol.PROMPT * cfg.hidden_size * cfg.num_hidden_layers * tokens
    return 2 * decoder * tokens + attention + 2 * head * smol.BATCH


def generate_figures(generate_s: float, prompt_s: float, bound: float) -> dict:
    """A generate call (prompt pass, then NEW_TOKENS - 1 decode steps) split into its prompt pass (a call with one
    new token) and its decode steps (the difference), the steps' tokens/s against the bandwidth bound."""
    steps = smol.BATCH * (smol.NEW_TOKENS - 1) / (generate_s - prompt_s)
    return {"generate_tokens_s": smol.BATCH * smol.NEW_TOKENS / generate_s, "prompt_seconds": prompt_s,
            "decode_steps_tokens_s": steps, "decode_steps_of_bound": steps / bound}


def print_generate(name: str, figures: dict, bound: float) -> None:
    print(f"generate {name} (batch {smol.BATCH}, {smol.PROMPT}-token prompts, {smol.NEW_TOKENS} new tokens): "
          f"{figures['generate_tokens_s']:.1f} tokens/s; prompt pass {figures['prompt_seconds']:.3f} s; decode "
          f"steps {figures['decode_steps_tokens_s']:.1f} tokens/s = {figures['decode_steps_of_bound']:.0%} of the "
          f"bandwidth bound {bound:.1f} tokens/s")


def decode_ceiling(gemms_s: float, bound: float) -> dict:
    """Decode steps that ran nothing but their weight GEMMs (one pass of decode_gemms in gemms_s seconds)."""
    tokens_s = smol.BATCH / gemms_s
    return {"decode_gemms_tokens_s": tokens_s, "decode_gemms_of_bound": tokens_s / bound}


def print_decode_ceiling(ceiling: dict) -> None:
    print(f"ceiling: decode steps that ran only their weight GEMMs (one call each over the fused decoder's weights) "
          f"at batch {smol.BATCH}: {ceiling['decode_gemms_tokens_s']:.1f} tokens/s = "
          f"{ceiling['decode_gemms_of_bound']:.0%} of the bound")


def write_result(benchmark: str, result: dict, args) -> dict:
    """<benchmark>_<stamp>.json (benchmarks/record.py: --results-dir, --record, --no-save), --json's file, and the
    RESULT line."""
    if not args.no_save:
        from benchmarks import record

        record.save(benchmark, {k: v for k, v in result.items() if k != "machine"}, record.results_dir(args),
                    machine=result["machine"])
    path = args.json
    if path:
        with open(path, "w", encoding="utf-8") as f:
            json.dump(result, f, indent=2)
    print("RESULT " + json.dumps(result))
    return result


def decode_only(args) -> dict:
    """The bound and greedy decoding through FusedDecoder and through the model's layers, alternating call by
    call with the prompt pass alone and the decode step's weight GEMMs alone (medians of --repeats each), so the
    figures share the machine's state."""
    before = bandwidth(args.repeats)
    ours = smol.Ours(smol.ensure_checkpoint(args.model))
    gemms = decode_gemms(ours.model, smol.BATCH)
    paths = {"fused": lambda: ours.generate(fused=True), "layers": lambda: ours.generate(fused=False),
             "prompt": lambda: ours.generate(new_tokens=1), "weight_gemms": lambda: run_decode_gemms(gemms)}
    times = {name: [] for name in paths}
    warmups = {name: settle(fn) for name, fn in paths.items()}
    for _ in range(args.repeats):
        for name, fn in paths.items():
            start = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - start)
    memory = {"before": before, "after": bandwidth(args.repeats)}
    best, line = best_bandwidth(memory["before"], memory["after"])
    bound = decode_bound(ours.model, best)
    prompt_s = statistics.median(times["prompt"])
    figures = {name: generate_figures(statistics.median(times[name]), prompt_s, bound) for name in ("fused",
                                                                                                  "layers")}
    print(f"{line}; bandwidth bound {bound:.1f} tokens/s per decode step")
    for name, fig in figures.items():
        print_generate(name, fig, bound)
    ratio = figures["fused"]["decode_steps_tokens_s"] / figures["layers"]["decode_steps_tokens_s"]
    print(f"decode steps, fused / layers: {ratio:.2f}x")
    ceiling = decode_ceiling(statistics.median(times["weight_gemms"]), bound)
    print_decode_ceiling(ceiling)
    return write_result("decode_only", {"machine": machine_facts(), "bandwidth_gb_s": memory,
                                        "decode_bound_tokens_s": bound, "generate": figures, "ceiling": ceiling,
                                        "seconds": times, "warmup_calls": warmups}, args)


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    parser.add_argument("--model", default=smol.DEFAULT_MODEL)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--json", default=None, help="also write the figures here")
    from benchmarks import record

    record.add_arguments(parser)
    parser.add_argument("--decode-only", action="store_true",
                        help="only the bandwidth and greedy decoding, fused decoder and model layers alternating")
    args = parser.parse_args(argv)
    print(describe_machine(machine_facts()))
    if args.decode_only:
        return decode_only(args)
    gemm = gemm_peaks(args.repeats)
    peak = max(max(v.values()) for v in gemm.values())
    before = bandwidth(args.repeats)
    ours = smol.Ours(smol.ensure_checkpoint(args.model))
    cfg = ours.model.config
    shape = {"params": list(ours.model.parameters()), "hidden": cfg.hidden_size, "layers": cfg.num_hidden_layers}
    workloads = {"train_step": ours.train_step, "score": ours.score, "generate": ours.generate,
                 "prompt": lambda: ours.generate(new_tokens=1)}
    warmups = {name: settle(fn) for name, fn in workloads.items()}
    seconds = {name: median_seconds(fn, args.repeats, warm=True) for name, fn in workloads.items()}
    train_calls, train_gemm_flops = train_gemms(ours.model, smol.BATCH, smol.SEQ)
    seconds["train_gemms"] = median_seconds(lambda: run_matmuls(train_calls), args.repeats)
    score_calls, score_gemm_flops = train_gemms(ours.model, smol.BATCH, smol.SEQ, backward=False)
    seconds["score_gemms"] = median_seconds(lambda: run_matmuls(score_calls), args.repeats)
    decode_calls = decode_gemms(ours.model, smol.BATCH)
    seconds["decode_gemms"] = median_seconds(lambda: run_decode_gemms(decode_calls), args.repeats)
    del train_calls, score_calls, decode_calls  # ~0.4 GB by their shapes, freed before the bandwidth is measured again
    memory = {"before": before, "after": bandwidth(args.repeats)}
    best, line = best_bandwidth(memory["before"], memory["after"])
    tokens = smol.BATCH * smol.SEQ
    train_gflops = model_flops(shape, tokens, smol.SEQ, 6) / seconds["train_step"] / 1e9
    score_gflops = model_flops(shape, tokens, smol.SEQ, 2) / seconds["score"] / 1e9
    prompt_work = prompt_flops(ours.model)
    prompt_gflops = prompt_work / seconds["prompt"] / 1e9
    bound = decode_bound(ours.model, best)
    figures = generate_figures(seconds["generate"], seconds["prompt"], bound)
    # the whole call's bound: its prompt pass at the GEMM peak, its decode steps at the bandwidth bound
    generate_bound_s = prompt_work / (peak * 1e9) + smol.BATCH * (smol.NEW_TOKENS - 1) / bound
    train_gemms_gflops = train_gemm_flops / seconds["train_gemms"] / 1e9
    score_gemms_gflops = score_gemm_flops / seconds["score_gemms"] / 1e9
    ceiling = {"train_gemms_gflops": train_gemms_gflops, "train_gemms_of_peak": train_gemms_gflops / peak,
               "score_gemms_gflops": score_gemms_gflops, "score_gemms_of_peak": score_gemms_gflops / peak,
               "score_gemms_of_score": seconds["score_gemms"] / seconds["score"],
               **decode_ceiling(seconds["decode_gemms"], bound)}
    result = {"machine": machine_facts(), "gemm_gflops": gemm, "gemm_peak_gflops": peak, "bandwidth_gb_s": memory,
              "train_gflops": train_gflops, "train_of_peak": train_gflops / peak, "score_gflops": score_gflops,
              "score_of_peak": score_gflops / peak, "prompt_gflops": prompt_gflops,
              "prompt_of_peak": prompt_gflops / peak, "decode_bound_tokens_s": bound, **figures,
              "generate_of_bound": generate_bound_s / seconds["generate"], "ceiling": ceiling, "seconds": seconds,
              "warmup_calls": warmups}
    print(f"GEMM peak {peak:.0f} GFLOP/s; {line}")
    print("warm-up calls until one faulted in no new page: " + ", ".join(f"{k} {v}" for k, v in warmups.items()))
    print(f"train_step {train_gflops:.0f} GFLOP/s = {train_gflops / peak:.0%} of the GEMM peak; score "
          f"{score_gflops:.0f} GFLOP/s = {score_gflops / peak:.0%}; generate's prompt pass {prompt_gflops:.0f} "
          f"GFLOP/s = {prompt_gflops / peak:.0%}")
    print_generate("", figures, bound)
    print(f"the whole generate call: {seconds['generate']:.3f} s against its bound {generate_bound_s:.3f} s = "
          f"{result['generate_of_bound']:.0%}")
    print(f"ceiling: the training step's own GEMMs alone (Paddle's matmul) {train_gemms_gflops:.0f} GFLOP/s = "
          f"{ceiling['train_gemms_of_peak']:.0%} of the GEMM peak")
    print(f"ceiling: a scoring pass's own GEMMs alone {score_gemms_gflops:.0f} GFLOP/s = "
          f"{ceiling['score_gemms_of_peak']:.0%} of the GEMM peak; they take "
          f"{ceiling['score_gemms_of_score']:.0%} of the score workload's time")
    print_decode_ceiling(ceiling)
    return write_result("machine_limits", result, args)


if __name__ == "__main__":
    main()
