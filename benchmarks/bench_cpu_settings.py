"""Which CPU settings make Paddle fastest on this machine: fp32 GEMM GFLOP/s (1024 x 1024 x 1024, and SmolLM2's
decode GEMM 8 x 576 x 1536), a training step's tokens/s and a rollout's (16 prompts x 32 greedy tokens) under each
candidate setting, each measured in a fresh process (the variables only act before paddle is imported).

    python benchmarks/bench_cpu_settings.py [--repeats 3] [--rounds 2] [--json out.json]

Candidates: what alignment/cpu_env.py chooses for this CPU (on an AMD CPU with AVX-512, the MKL path
alignment/mkl_path.py measured faster), the same without / with MKL_DEBUG_CPU_TYPE=5 (and =7, MKL's AVX-512 path,
on an AMD CPU with AVX-512), OpenMP threads instead of (or as well as) MKL threads, one MKL
thread, Paddle's strided views left on, glibc's default allocator instead of ALIGNMENT_MALLOC=heap, and the
optimizer step on one OpenMP thread instead of ALIGNMENT_OPTIMIZER_THREADS = cores, and the OpenMP threads sleeping
as soon as a parallel region ends or spinning the runtime's 200 ms (identical candidates are measured once). Prints
one row per candidate with ratios to the chosen setting and the spread of its rounds, so
the choice can be re-checked on any new machine (the CPU model is printed with the figures); a candidate ahead of
the chosen one by less than the rounds' spread is reported as a tie, not as a better setting.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from alignment.cpu_env import (SETTINGS, cpu_defaults, cpu_model, cpuinfo_fields, machine_facts,  # noqa: E402
                               usable_cores)
from alignment.mkl_path import possible_paths  # noqa: E402

CHILD = r"""
import json, os, sys, time
sys.path.insert(0, ROOT)
from alignment.cpu_env import configure_malloc, optimizer_threads
configure_malloc(os.environ.get("ALIGNMENT_MALLOC", "system"))
import paddle
from alignment.models import LlamaConfig, LlamaForCausalLM

def best(fn, repeats):
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter(); fn(); times.append(time.perf_counter() - start)
    return min(times)

a, b = paddle.randn([1024, 1024]), paddle.randn([1024, 1024])
gemm = best(lambda: float(paddle.matmul(a, b)[0, 0]), REPEATS * 3)
x, w = paddle.randn([8, 576]), paddle.randn([576, 1536])  # SmolLM2's decode GEMM at batch 8
decode = best(lambda: [float(paddle.matmul(x, w)[0, 0]) for _ in range(20)], REPEATS * 3) / 20
paddle.seed(0)
config = LlamaConfig(vocab_size=8000, hidden_size=256, intermediate_size=704, num_hidden_layers=4,
                     num_attention_heads=8, num_key_value_heads=4, max_position_embeddings=512)
model = LlamaForCausalLM(config)
optimizer = paddle.optimizer.AdamW(1e-4, parameters=model.parameters())
ids = paddle.randint(0, 8000, [8, 128])

def step():
    hidden, _ = model.model(ids)
    log_probs, _ = model.token_log_probs(hidden[:, :-1].reshape([-1, 256]), ids[:, 1:].reshape([-1]))
    (-log_probs.mean()).backward()
    with optimizer_threads():  # as the trainers step their optimizers
        optimizer.step()
    optimizer.clear_grad()

train = best(step, REPEATS)
from alignment.models import GenerationConfig, generate
prompts = paddle.randint(3, 8000, [16, 14])
greedy = GenerationConfig(max_new_tokens=32, do_sample=False, eos_token_id=None, pad_token_id=0)

def rollout():
    with paddle.no_grad():
        generate(model, prompts, paddle.ones_like(prompts), greedy)

rollouts = best(rollout, REPEATS)
print(json.dumps({"gemm_gflops": 2 * 1024 ** 3 / gemm / 1e9, "decode_gemm_gflops": 2 * 8 * 576 * 1536 / decode / 1e9,
                  "train_tokens_per_s": 8 * 128 / train, "generate_tokens_per_s": 16 * 32 / rollouts}))
"""


def candidates() -> dict:
    cpu, cores = cpuinfo_fields(), usable_cores()
    chosen = cpu_defaults(cpu, cores)
    without = {k: v for k, v in chosen.items() if k != "MKL_DEBUG_CPU_TYPE"}
    found = {"chosen for this CPU": chosen,
             "without MKL_DEBUG_CPU_TYPE": without,
             "with MKL_DEBUG_CPU_TYPE=5": {**without, "MKL_DEBUG_CPU_TYPE": "5"},
             **({"with MKL_DEBUG_CPU_TYPE=7 (AVX-512)": {**without, "MKL_DEBUG_CPU_TYPE": "7"}}
                if "7" in possible_paths(cpu) else {}),  # on any AMD CPU with its instructions
             "OpenMP threads (OMP=cores, MKL=1)": {**chosen, "OMP_NUM_THREADS": str(cores), "MKL_NUM_THREADS": "1"},
             "OpenMP and MKL threads (OMP=MKL=cores)": {**chosen, "OMP_NUM_THREADS": str(cores),
                                                         "MKL_NUM_THREADS": str(cores)},
             "one MKL thread": {**chosen, "MKL_NUM_THREADS": "1"},
             "strided views on (Paddle's default)": {**chosen, "FLAGS_use_stride_kernel": "1"},
             "glibc's default allocator": {**chosen, "ALIGNMENT_MALLOC": "system"},
             "optimizer step on one thread": {**chosen, "ALIGNMENT_OPTIMIZER_THREADS": "1"},
             "OpenMP threads sleep at once (KMP_BLOCKTIME=0)": {**chosen, "KMP_BLOCKTIME": "0"},
             "OpenMP threads spin 200 ms (the runtime's default)": {**chosen, "KMP_BLOCKTIME": "200"}}
    unique = {}
    for name, settings in found.items():  # on AMD the chosen setting already has MKL_DEBUG_CPU_TYPE 5 or 7
        if settings not in unique.values():
            unique[name] = settings
    return unique


def verdict(results: dict) -> str:
    """Which setting trained fastest, and whether it beat the chosen one by more than the rounds' spread."""
    fastest = max(results, key=lambda name: results[name]["train_tokens_per_s"])
    if fastest == "chosen for this CPU":
        return f"fastest training step: {fastest}"
    chosen, best = results["chosen for this CPU"], results[fastest]
    lead = best["train_tokens_per_s"] / chosen["train_tokens_per_s"] - 1.0
    noise = max(chosen["spread"], best["spread"])
    if lead <= noise:
        return (f"fastest training step: {fastest} by {100 * lead:.1f}%, within the rounds' spread of "
                f"{100 * noise:.1f}%: a tie with the chosen setting")
    return (f"fastest training step: {fastest} by {100 * lead:.1f}% (rounds' spread {100 * noise:.1f}%): "
            "not the chosen setting, alignment/cpu_env.py should change")


def measure(settings: dict, repeats: int) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in SETTINGS}
    env.update(settings)
    code = CHILD.replace("ROOT", repr(ROOT)).replace("REPEATS", str(repeats))
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3, help="timed repeats inside each process (best kept)")
    parser.add_argument("--rounds", type=int, default=2, help="passes over the candidates, interleaved so a "
                                                               "machine's load drifts over all of them alike")
    parser.add_argument("--json", default=None, help="also write the figures here")
    from benchmarks import record

    record.add_arguments(parser)
    args = parser.parse_args(argv)
    vendor, model = cpu_model()
    print(f"CPU: {model or vendor} ({vendor}), {usable_cores()} usable cores")
    results = {}
    for _ in range(args.rounds):
        for name, settings in candidates().items():
            figures = measure(settings, args.repeats)
            kept = results.setdefault(name, {"settings": settings, **figures, "rounds_tokens_per_s": []})
            kept["rounds_tokens_per_s"].append(figures["train_tokens_per_s"])
            for key, value in figures.items():
                kept[key] = max(kept[key], value)
    for r in results.values():  # how far apart the rounds of one candidate were: the noise of this machine
        r["spread"] = max(r["rounds_tokens_per_s"]) / min(r["rounds_tokens_per_s"]) - 1.0
    base = results["chosen for this CPU"]
    print(f"{'setting':50s} {'GEMM GFLOP/s':>13s} {'x chosen':>9s} {'decode GEMM':>12s} {'x chosen':>9s} "
          f"{'train tok/s':>12s} {'x chosen':>9s} {'spread':>7s} {'rollout tok/s':>14s} {'x chosen':>9s}")
    for name, r in results.items():
        print(f"{name:50s} {r['gemm_gflops']:13.1f} {r['gemm_gflops'] / base['gemm_gflops']:9.2f} "
              f"{r['decode_gemm_gflops']:12.1f} {r['decode_gemm_gflops'] / base['decode_gemm_gflops']:9.2f} "
              f"{r['train_tokens_per_s']:12.0f} {r['train_tokens_per_s'] / base['train_tokens_per_s']:9.2f} "
              f"{100 * r['spread']:6.1f}% {r['generate_tokens_per_s']:14.0f} "
              f"{r['generate_tokens_per_s'] / base['generate_tokens_per_s']:9.2f}")
    print(verdict(results))
    facts = {k: v for k, v in machine_facts().items() if k != "settings"}  # settings: per candidate
    if not args.no_save:
        record.save("cpu_settings", {"results": results}, record.results_dir(args), machine=facts)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({"machine": facts, "results": results}, f, indent=2)
    return results


if __name__ == "__main__":
    main()
