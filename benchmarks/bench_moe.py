"""A tiny mixture-of-experts model against dense models of the same size: training step time, peak memory and
greedy decoding, measured in the same run.

    python benchmarks/bench_moe.py [--batch 8] [--seq 128] [--steps 5] [--new-tokens 64]

Three models on TRL's small test shape (hidden 256, 4 layers, 4 heads, vocabulary 8000): a Qwen3-MoE with 8
experts of 256 and top 2 on every layer, with the load-balancing loss in its training loss as transformers adds
it (`output_router_logits`); a dense Qwen3 whose MLP is 512 wide (the MoE's active compute per token: 2 experts of
256); and a dense Qwen3 whose MLP is 2048 wide (the MoE's parameters: 8 experts of 256). Each runs in its own
process (so its peak resident memory is its own): --steps AdamW steps on [--batch, --seq] random tokens after two
warm-up steps (median step time, tokens/s), then greedy decoding of --new-tokens tokens for --batch prompts of 32
through the decode engine (MoE layers decode through the model's layers, the dense ones through the fused
decoder). Ratios are MoE / dense. Writes moe_<timestamp>.json (benchmarks/record.py: --results-dir, --record,
--no-save).
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if not __package__:  # run as a script from a checkout: make `alignment` importable
    sys.path.insert(0, ROOT)

from alignment.cpu_env import apply_cpu_defaults, describe_machine, machine_facts  # noqa: E402

apply_cpu_defaults()  # this CPU's thread and MKL settings, before paddle is imported

BASE = dict(hidden_size=256, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=4, head_dim=64,
            vocab_size=8000, max_position_embeddings=512, rms_norm_eps=1e-6, tie_word_embeddings=False,
            initializer_range=0.02)
EXPERTS, TOP_K, EXPERT_WIDTH = 8, 2, 256
MODELS = {
    "moe": dict(BASE, model_type="qwen3_moe", intermediate_size=EXPERT_WIDTH, moe_intermediate_size=EXPERT_WIDTH,
                num_experts=EXPERTS, num_experts_per_tok=TOP_K, norm_topk_prob=True, decoder_sparse_step=1,
                mlp_only_layers=[], output_router_logits=True, router_aux_loss_coef=0.001),
    "dense_same_compute": dict(BASE, model_type="qwen3", intermediate_size=TOP_K * EXPERT_WIDTH),
    "dense_same_parameters": dict(BASE, model_type="qwen3", intermediate_size=EXPERTS * EXPERT_WIDTH),
}


def run_one(name: str, batch: int, seq: int, steps: int, new_tokens: int) -> dict:
    """Train and decode one model in this process; -> its figures."""
    import numpy as np
    import paddle
    import paddle.nn.functional as F

    from alignment.models import GenerationConfig, LlamaConfig, LlamaForCausalLM, generate
    from alignment.models.moe import moe_training_terms

    paddle.seed(0)
    model = LlamaForCausalLM(LlamaConfig.from_dict(MODELS[name]))
    optimizer = paddle.optimizer.AdamW(1e-4, parameters=model.parameters())
    rng = np.random.default_rng(0)
    ids = paddle.to_tensor(rng.integers(3, BASE["vocab_size"], [batch, seq]), dtype="int64")
    times = []
    for step in range(2 + steps):
        start = time.perf_counter()
        logits = model(ids).logits  # [batch, seq, vocab]
        loss = F.cross_entropy(logits[:, :-1].reshape([-1, BASE["vocab_size"]]), ids[:, 1:].reshape([-1, 1]))
        aux, _ = moe_training_terms(model)
        (loss if aux is None else loss + aux).backward()
        optimizer.step()
        optimizer.clear_grad()
        if step >= 2:
            times.append(time.perf_counter() - start)
    model.eval()
    prompts = paddle.to_tensor(rng.integers(3, BASE["vocab_size"], [batch, 32]), dtype="int64")
    config = GenerationConfig(max_new_tokens=new_tokens, do_sample=False, eos_token_id=None, pad_token_id=0)
    with paddle.no_grad():
        generate(model, prompts[:1], paddle.ones([1, 32], "int64"), GenerationConfig(max_new_tokens=2))  # warm-up
        start = time.perf_counter()
        generate(model, prompts, paddle.ones([batch, 32], "int64"), config)
        decode_s = time.perf_counter() - start
    step_s = statistics.median(times)
    return {"parameters_m": sum(int(np.prod(p.shape)) for p in model.parameters()) / 1e6, "step_s": step_s,
            "train_tokens_per_s": batch * seq / step_s, "decode_tokens_per_s": batch * new_tokens / decode_s,
            "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--new-tokens", type=int, default=64)
    p.add_argument("--one", choices=sorted(MODELS), help=argparse.SUPPRESS)  # the child's model
    from benchmarks import record

    record.add_arguments(p)
    args = p.parse_args(argv)
    if args.one:
        print(json.dumps(run_one(args.one, args.batch, args.seq, args.steps, args.new_tokens)))
        return {}
    models = {}
    for name in MODELS:
        out = subprocess.run([sys.executable, os.path.abspath(__file__), "--one", name, "--batch", str(args.batch),
                              "--seq", str(args.seq), "--steps", str(args.steps), "--new-tokens",
                              str(args.new_tokens)], capture_output=True, text=True, cwd=ROOT)
        if out.returncode:
            raise SystemExit(f"bench_moe: the {name} run failed: {out.stderr.strip().splitlines()[-1]}")
        models[name] = json.loads(out.stdout.strip().splitlines()[-1])
        print(f"{name}: {models[name]}", flush=True)
    moe = models["moe"]
    ratios = {dense: {"step_time": moe["step_s"] / models[dense]["step_s"],
                      "peak_rss": moe["peak_rss_mib"] / models[dense]["peak_rss_mib"],
                      "decode_tokens_per_s": moe["decode_tokens_per_s"] / models[dense]["decode_tokens_per_s"]}
              for dense in MODELS if dense != "moe"}
    lines = ["| model | parameters (M) | train step s | train tokens/s | peak RSS MiB | decode tokens/s |",
             "| --- | ---: | ---: | ---: | ---: | ---: |"]
    lines += [f"| {name} | {m['parameters_m']:.2f} | {m['step_s']:.3f} | {m['train_tokens_per_s']:.0f} | "
              f"{m['peak_rss_mib']:.0f} | {m['decode_tokens_per_s']:.0f} |" for name, m in models.items()]
    lines += [f"\nMoE / {dense}: step time {r['step_time']:.2f}x, peak RSS {r['peak_rss']:.2f}x, decode tokens/s "
              f"{r['decode_tokens_per_s']:.2f}x" for dense, r in ratios.items()]
    print("\n".join(lines) + f"\n\n({describe_machine(machine_facts())})")
    figures = {"batch": args.batch, "seq": args.seq, "steps": args.steps, "new_tokens": args.new_tokens,
               "experts": EXPERTS, "top_k": TOP_K, "expert_width": EXPERT_WIDTH, "models": models, "ratios": ratios}
    record.save("moe", figures, record.results_dir(args), machine_facts())
    return figures


if __name__ == "__main__":
    main()
