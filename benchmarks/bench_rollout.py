"""Rollout speed: new tokens per second with the KV cache (eager, and the static-graph decode step) vs recomputing
the whole sequence every step.

    python benchmarks/bench_rollout.py [--batches 1,8,32] [--new-tokens 64] [--prompt-lens 16,64] [--repeats 2]

A random-init LLaMA of the peer benchmark's shape (hidden 256, intermediate 1024, 4 layers, 4 heads, vocab 8000)
built from config; greedy decoding of exactly --new-tokens tokens (no eos) from random prompts. For each prompt
length and batch size it times `generate` (the decode engine), the same with `static=StaticDecoder(model)` (compiled once per shape
before timing) and `generate_without_cache` (best of --repeats), checks all three produce the same tokens, and prints a
Markdown table with tokens/s and the speed-ups. Writes rollout_<timestamp>.{json,png} (the figures, and a bar chart
of tokens/s per batch size; benchmarks/record.py: --results-dir, --record, --no-save).
"""
from __future__ import annotations

import argparse
import os
import sys
import time

if not __package__:  # run as a script from a checkout: make `alignment` importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from alignment.cpu_env import apply_cpu_defaults, describe_machine, machine_facts  # noqa: E402

apply_cpu_defaults()  # this CPU's thread and MKL settings, before paddle is imported


def main(argv=None) -> list:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--batches", default="1,8,32")
    p.add_argument("--new-tokens", type=int, default=64)
    p.add_argument("--prompt-lens", default="16,64", help="prompt lengths (the no-cache path's cost grows with them)")
    p.add_argument("--repeats", type=int, default=2)
    from benchmarks import record

    record.add_arguments(p)
    args = p.parse_args(argv)

    import paddle

    from alignment.models import GenerationConfig, LlamaConfig, LlamaForCausalLM, generate, generate_without_cache
    from alignment.models.static_decode import StaticDecoder

    paddle.seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=8000, hidden_size=256, intermediate_size=1024,
                                         num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=4,
                                         max_position_embeddings=512))
    model.eval()
    config = GenerationConfig(max_new_tokens=args.new_tokens, do_sample=False, eos_token_id=None)
    rows = []
    shapes = [(int(p), int(b)) for p in args.prompt_lens.split(",") for b in args.batches.split(",")]
    for prompt_len, batch in shapes:
        ids = paddle.randint(3, 8000, [batch, prompt_len])
        mask = paddle.ones_like(ids)
        static = StaticDecoder(model)
        generate(model, ids, mask, config, static=static)  # compile outside the timing
        variants = {"kv": lambda: generate(model, ids, mask, config),
                    "static": lambda: generate(model, ids, mask, config, static=static),
                    "none": lambda: generate_without_cache(model, ids, mask, config)}
        timings, outputs = {}, {}
        for name, run in variants.items():
            best = float("inf")
            for _ in range(args.repeats):
                start = time.perf_counter()
                out = run()
                best = min(best, time.perf_counter() - start)
            timings[name], outputs[name] = best, out.sequences.numpy()
        same = all(bool((outputs[n] == outputs["kv"]).all()) for n in variants)
        tokens = batch * args.new_tokens
        rows.append({"prompt": prompt_len, "batch": batch,
                     **{f"{n}_tokens_per_s": tokens / t for n, t in timings.items()},
                     "kv_over_none": timings["none"] / timings["kv"], "static_over_kv": timings["kv"] / timings["static"],
                     "same_tokens": same})
    lines = ["| prompt | batch | KV cache, eager | KV cache, static step | no cache | KV / no cache | static / eager | "
             "same tokens |", "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |"]
    lines += [f"| {r['prompt']} | {r['batch']} | {r['kv_tokens_per_s']:.0f} | {r['static_tokens_per_s']:.0f} | "
              f"{r['none_tokens_per_s']:.0f} | {r['kv_over_none']:.1f}x | {r['static_over_kv']:.2f}x | "
              f"{r['same_tokens']} |" for r in rows]
    table = "\n".join(lines) + f"\n\n(new tokens per second; greedy, {args.new_tokens} new tokens after " \
        f"prompts of the given length, best of {args.repeats}; {describe_machine(machine_facts())})\n"
    print(table)
    if not args.no_save:
        for path in save(rows, {"new_tokens": args.new_tokens, "repeats": args.repeats}, record.results_dir(args)):
            print(f"wrote {path}")
    return rows


def save(rows, settings: dict, results_dir: str) -> list:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from benchmarks import record

    path = record.save("rollout", {**settings, "rows": rows}, results_dir)
    base = path[:-len(".json")]
    fig, ax = plt.subplots(figsize=(max(7, 1.2 * len(rows)), 3.5))
    width = 0.27
    for k, (key, label) in enumerate([("kv_tokens_per_s", "KV cache, eager"),
                                      ("static_tokens_per_s", "KV cache, static step"),
                                      ("none_tokens_per_s", "no cache")]):
        ax.bar([i + (k - 1) * width for i in range(len(rows))], [r[key] for r in rows], width, label=label)
    ax.set_xticks(range(len(rows)), [f"p{r['prompt']} b{r['batch']}" for r in rows])
    ax.set_ylabel("new tokens / s")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(base + ".png", dpi=90)
    plt.close(fig)
    return [path, base + ".png"]


if __name__ == "__main__":
    main()
