"""Rollout speed: new tokens per second with the KV cache vs recomputing the whole sequence every step.

    python benchmarks/bench_rollout.py [--batches 1,8,32] [--new-tokens 64] [--prompt-len 16] [--repeats 2]

A random-init LLaMA of the peer benchmark's shape (hidden 256, intermediate 1024, 4 layers, 4 heads, vocab 8000)
built from config; greedy decoding of exactly --new-tokens tokens (no eos) from random prompts. For each batch
size it times `generate(..., use_cache=True)` and `use_cache=False` (best of --repeats), checks both produce the
same tokens, and prints a Markdown table with tokens/s and the speed-up. Writes nothing.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import alignment  # noqa: E402,F401  (sets CPU thread defaults before paddle is imported)


def main(argv=None) -> list:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--batches", default="1,8,32")
    p.add_argument("--new-tokens", type=int, default=64)
    p.add_argument("--prompt-len", type=int, default=16)
    p.add_argument("--repeats", type=int, default=2)
    args = p.parse_args(argv)

    import paddle

    from alignment.models import GenerationConfig, LlamaConfig, LlamaForCausalLM, generate

    paddle.seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=8000, hidden_size=256, intermediate_size=1024,
                                         num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=4,
                                         max_position_embeddings=512))
    model.eval()
    config = GenerationConfig(max_new_tokens=args.new_tokens, do_sample=False, eos_token_id=None)
    rows = []
    for batch in [int(b) for b in args.batches.split(",")]:
        ids = paddle.randint(3, 8000, [batch, args.prompt_len])
        mask = paddle.ones_like(ids)
        timings, outputs = {}, {}
        for use_cache in (True, False):
            best = float("inf")
            for _ in range(args.repeats):
                start = time.perf_counter()
                out = generate(model, ids, mask, config, use_cache=use_cache)
                best = min(best, time.perf_counter() - start)
            timings[use_cache], outputs[use_cache] = best, out.sequences.numpy()
        same = bool((outputs[True] == outputs[False]).all())
        tokens = batch * args.new_tokens
        rows.append({"batch": batch, "kv_tokens_per_s": tokens / timings[True],
                     "no_cache_tokens_per_s": tokens / timings[False], "speedup": timings[False] / timings[True],
                     "same_tokens": same})
    print(f"| batch | KV cache (new tokens/s) | no cache (new tokens/s) | speed-up | same tokens |")
    print("| ---: | ---: | ---: | ---: | --- |")
    for r in rows:
        print(f"| {r['batch']} | {r['kv_tokens_per_s']:.0f} | {r['no_cache_tokens_per_s']:.0f} | "
              f"{r['speedup']:.1f}x | {r['same_tokens']} |")
    return rows


if __name__ == "__main__":
    main()
