#!/usr/bin/env python
"""What overlapping rollouts and training buys on paper: a 7B LLaMA policy on 8 GPUs, synchronous against
asynchronous (max_staleness >= 1) for every split of the GPUs into rollout and training ranks.

    python benchmarks/async_on_paper.py [--responses 256] [--prompt 512] [--response 1024] [--decode-efficiency 0.5]

A roofline estimate, not a measurement (no GPU here). Decode: every step reads the weights and the KV cache of
the step's sequences once (memory-bound at these batch sizes), at `decode_efficiency` of the HBM bandwidth.
Training: 6 x params x tokens for the update plus 2 x params x tokens for each of the reference and old
log-probs passes (GRPO without a critic), at `mfu` of the bf16 peak. Weight sync: the bf16 weights once over
NVLink. A synchronous step is generate + train on all 8 GPUs; an asynchronous one is the slower of the two roles
on their own GPUs plus the sync. Prints a Markdown table.
"""
from __future__ import annotations

import argparse

LLAMA_7B = {"params": 6.74e9, "layers": 32, "hidden": 4096, "kv_hidden": 4096}
A100 = {"bf16_flops": 312e12, "hbm_bytes_per_s": 2.0e12, "nvlink_bytes_per_s": 300e9}


def decode_seconds(gpus: int, responses: int, prompt: int, response: int, efficiency: float) -> float:
    """Data-parallel replicas (7B fits one 80 GB GPU): each decodes responses / gpus sequences token by token."""
    per_gpu = responses / gpus
    weight_bytes = 2 * LLAMA_7B["params"]
    kv_per_token = 2 * LLAMA_7B["layers"] * LLAMA_7B["kv_hidden"] * 2  # k and v, bf16
    mean_context = prompt + response / 2
    step = (weight_bytes + per_gpu * mean_context * kv_per_token) / (A100["hbm_bytes_per_s"] * efficiency)
    return step * response


def train_seconds(gpus: int, responses: int, prompt: int, response: int, mfu: float) -> float:
    tokens = responses * (prompt + response)
    flops = (6 + 2 + 2) * LLAMA_7B["params"] * tokens
    return flops / (gpus * A100["bf16_flops"] * mfu)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--responses", type=int, default=256)
    parser.add_argument("--prompt", type=int, default=512)
    parser.add_argument("--response", type=int, default=1024)
    parser.add_argument("--decode-efficiency", type=float, default=0.5)
    parser.add_argument("--mfu", type=float, default=0.4)
    a = parser.parse_args()
    sync_gen = decode_seconds(a.gpus, a.responses, a.prompt, a.response, a.decode_efficiency)
    sync_train = train_seconds(a.gpus, a.responses, a.prompt, a.response, a.mfu)
    sync = sync_gen + sync_train
    weight_sync = 2 * LLAMA_7B["params"] / A100["nvlink_bytes_per_s"]
    print(f"7B policy, {a.gpus} A100-80GB, {a.responses} responses x ({a.prompt} prompt + {a.response} response) "
          f"tokens, decode at {a.decode_efficiency:.0%} of HBM bandwidth, training at {a.mfu:.0%} MFU\n")
    print("| layout | generate s | train s | step s | speed-up |\n| --- | ---: | ---: | ---: | ---: |")
    print(f"| synchronous, {a.gpus} GPUs both roles | {sync_gen:.1f} | {sync_train:.1f} | {sync:.1f} | 1.00x |")
    for rollout in range(1, a.gpus):
        gen = decode_seconds(rollout, a.responses, a.prompt, a.response, a.decode_efficiency)
        train = train_seconds(a.gpus - rollout, a.responses, a.prompt, a.response, a.mfu)
        step = max(gen, train) + weight_sync
        print(f"| async, {rollout} rollout + {a.gpus - rollout} training | {gen:.1f} | {train:.1f} | {step:.1f} | "
              f"{sync / step:.2f}x |")


if __name__ == "__main__":
    main()
