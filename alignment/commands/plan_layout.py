"""Plan a process layout (tensor x pipeline x sharding x data) for a LLaMA-family model: memory per GPU, per phase.

    python tools/plan_layout.py --model <config.json|HF dir> --gpus N --gpu-memory-gib M [--stage ppo|sft|rm|dpo]
        [--seq-len S] [--micro-batch B] [--rollout-batch R] [--dtype bf16|fp32] [--lora-rank r] [--device cpu] [--json]

Bytes per parameter: bf16 training = bf16 weights and gradients + AdamW's fp32 master weights and 2 moments (12 B);
fp32 = 4 + 4 + 8 B. Sharding (Paddle/PaddleNLP): stage1 splits AdamW states over the sharding ranks, stage2 also
gradients (during backward the other ranks' gradient buffers, up to 2**23 elements each, exist too), stage3 also
trained weights above --sharding-segment-size elements (smaller ones, and a causal LM's tied embedding table, stay
whole with their gradients and AdamW states; the largest sliced tensor and its gradient are whole while its layer
runs; PPO generates from a whole copy of the actor). Frozen models stay whole. stage2/3 do not combine with
pipeline parallelism. tp splits projections, vocabulary, LM head.

Activations per decoder layer and token (s seq, a heads, h hidden, q = a*d, k = kv_heads*d, i MLP width, t tensor
degree, B bytes per element). `--activations eager` (default), the tensors this toolkit's plain-Paddle layer
(alignment/models/llama.py: no fused kernels, on GPU too) keeps for backward, checked against RSS growth on CPU:
    B*[10h + ((q+2k) + 2(q+k) + (q+2k) + 2q*[GQA] + 2q + 4i)/t] + (4 + B*[B<4])*a*s/t
i.e. replicated: 2 RMSNorms x (normalised, expanded weight, output) + projection outputs and residual sums; split:
q/k/v, RoPE, head-major copies, GQA-expanded k/v, context, SwiGLU's 4 tensors; the softmax output in fp32.
`--activations korthikanti`: Korthikanti et al. 2022 (no sequence parallel): B/2 * s*b*h*(10 + 24/t + 5as/(ht)).
Full recompute keeps each layer's input (B*h per token) + one layer's activations. Once per forward: RoPE tables,
attention bias, embedding, final norm. Logits: fp32, 3 copies (logits, softmax, gradient) over the tokens through
the LM head. 1F1B pipeline: stage 0 holds pp micro-batches of ceil(L/pp) layers, the last stage one + the logits.
Rollout KV cache: 2 x L x kv_heads x d x seq x rollouts x B / t.

PPO as alignment/ppo runs it: actor and critic (score model = backbone + hidden x 1 head) are trained and pipelined;
reference and reward model (and DPO's reference) are frozen, tensor-split, never pipelined; under pp (or eval_mode
single with tp > 1) rollouts and old values come from whole unsplit copies of actor (and critic). Phases: generate, score (all four
models on device even with offload), train. Offload levels keep freeze_model, optimizer, train_model tensors on host
outside their phases (gradients stay). --device cpu: fp32 + measured Paddle runtime RSS; no offload.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

from alignment.commands.tool_parser import (ToolParser, fraction, int_range, non_negative_int, positive_int,
                                            positive_number)
from alignment.config.choices import parse_offload_levels
from alignment.planning.memory import GIB, Plan, PlanError, load_model, memory, model_params, peak
from alignment.planning.search import (NoFit, degrees, describe, ladder, layouts, name, offload_effect, recommend,
                                       runnable)


MAX_GPUS = 1 << 20  # layouts are enumerated over the divisors of the count


def measure_runtime_gib() -> float:
    """RSS of a fresh process after `import paddle` and one small tensor op (the CPU runtime's fixed cost)."""
    code = ("import paddle\nx = paddle.ones([16, 16])\nfloat((x @ x).sum())\n"
            "print([l for l in open('/proc/self/status') if l.startswith('VmRSS')][0].split()[1])")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600,
                          env=dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1"))
    if done.returncode != 0:
        raise PlanError(f"could not measure the Paddle runtime: {done.stderr.strip()[-300:]}; pass --runtime-gib")
    return int(done.stdout.split()[-1]) * 1024 / GIB


def table(m: Model, lays: list, p: Plan, capacity: float, allow_unbuilt: bool, top: int) -> str:
    """One row per layout (GiB per GPU) under plan p, lowest peak first."""
    keys = ("trained_weights", "grads", "adamw", "activations", "activations_recompute", "kv_cache", "frozen_models",
            "whole_copies")
    head = (f"{'layout (GiB per GPU)':<26}" + "".join(f"{k:>8}" for k in (
        "weights", "grads", "AdamW", "act", "act rc", "KV", "frozen", "copies", "peak")) + f"  {'phase':<9}fits")
    rows = []
    for lay in lays:
        mem = memory(m, lay, p)
        c, (phase, used) = mem["components"], peak(mem)
        note = "" if runnable(lay, p, allow_unbuilt) else "  (not buildable in this toolkit)"
        rows.append((used, f"{name(lay):<26}" + "".join(f"{c[k] / GIB:8.2f}" for k in keys)
                     + f"{used / GIB:8.2f}  {phase:<9}{'yes' if used <= capacity else 'no'}{note}"))
    return "\n".join([head, "-" * len(head)] + [r[1] for r in sorted(rows, key=lambda r: r[0])[:top]]
                     + [f"... {len(rows) - top} more layouts (--top N, or --json)"] * (len(rows) > top))


def parse_args(argv):
    """The command line (see the module docstring)."""
    ap = ToolParser(__doc__)
    add = ap.add_argument
    add("--model", required=True, help="config.json or a Hugging Face checkpoint directory")
    add("--gpus", type=int_range(1, MAX_GPUS), required=True)
    add("--gpu-memory-gib", type=positive_number, required=True, help="memory per GPU (per process with --device cpu)")
    add("--gpus-per-node", type=positive_int, default=8, help="tensor parallelism stays within a node")
    add("--stage", choices=("ppo", "sft", "rm", "dpo"), default="ppo")
    add("--seq-len", type=positive_int, default=512, help="tokens per row (PPO: prompt + response)")
    add("--response-len", type=positive_int, help="tokens generated / through the LM head (default: seq/2, SFT: seq)")
    add("--micro-batch", type=positive_int, default=8, help="rows per device per micro-batch (RM/DPO: pairs)")
    add("--rollout-batch", type=positive_int, default=8, help="PPO rollouts generated per device")
    add("--dtype", choices=("bf16", "fp32"), default="bf16")
    add("--lora-rank", type=non_negative_int, default=0, help="LoRA on all projections (PPO: actor and critic)")
    add("--recompute", action="store_true", help="require full recompute (otherwise added only when needed)")
    add("--offload", default="", help="PPO offload levels to require, e.g. 'freeze_model optimizer'")
    add("--eval-mode", choices=("tensor_parallel", "single"), default="tensor_parallel")
    add("--activations", choices=("eager", "korthikanti"), default="eager")
    add("--device", choices=("gpu", "cpu"), default="gpu", help="cpu: fp32 + the measured Paddle runtime RSS")
    add("--runtime-gib", type=positive_number, help="CPU runtime RSS to use instead of measuring it")
    add("--reserve", type=fraction, default=0.1, help="fraction kept free (CUDA context, NCCL, fragmentation)")
    for flag in ("--tp", "--pp", "--sharding-degree"):
        add(flag, type=positive_int, help="pin this degree")
    add("--allow-unbuilt", action="store_true", help="also recommend sharding stage2/3 with pipeline parallelism "
        "(refused here, as in PaddleNLP)")
    add("--sharding-segment-size", type=positive_int, default=2**20, help="stage3: parameters above this many "
        "elements are split (the key sharding_segment_size)")
    add("--top", type=positive_int, default=30, help="rows of the printed table")
    add("--json", action="store_true", help="machine-readable output")
    return ap.parse_args(argv)


def build_plan(args) -> Plan:
    """Plan from the command line; --device cpu forces fp32 and adds the (measured) runtime RSS."""
    try:
        levels = parse_offload_levels(args.offload)
    except ValueError as err:
        raise PlanError(f"--offload: {err}") from None
    if min(args.seq_len, args.micro_batch, args.rollout_batch) < 1 or args.lora_rank < 0:
        raise PlanError("--seq-len, --micro-batch and --rollout-batch must be >= 1, --lora-rank >= 0")
    cpu = args.device == "cpu"
    runtime = (args.runtime_gib if args.runtime_gib is not None else measure_runtime_gib()) if cpu else 0.0
    response = args.response_len or (args.seq_len // 2 if args.stage in ("ppo", "dpo") else args.seq_len)
    return Plan(args.stage, args.seq_len, min(response, args.seq_len), args.micro_batch, args.rollout_batch,
                "fp32" if cpu else args.dtype, args.lora_rank, args.recompute, levels, args.eval_mode,
                args.activations, runtime * GIB, args.device, args.sharding_segment_size)


def run(argv=None) -> dict:
    """Plan, print, return the result; PlanError on bad input, NoFit (after printing) when nothing fits."""
    args = parse_args(argv)
    m, p = load_model(args.model), build_plan(args)
    fixed = {k: v for k, v in (("tp", args.tp), ("pp", args.pp), ("sd", args.sharding_degree)) if v}
    lays = layouts(m, args.gpus, fixed=fixed)
    capacity = args.gpu_memory_gib * GIB * (1 - args.reserve)
    best = recommend(m, lays, p, capacity, args.gpus_per_node, args.allow_unbuilt)
    shown = best["plan"] if best else p._replace(recompute=True, offload=frozenset(ladder(p)[-1][1]))
    params = {"causal": model_params(m, "causal"), "score": model_params(m, "score")}
    result = {"model": m._asdict(), "parameters": params, "capacity_gib": capacity / GIB, "recommended": None,
              "plan": {**shown._asdict(), "offload": sorted(shown.offload)}, "layouts": []}
    for lay, mem in ((lay, memory(m, lay, shown)) for lay in lays):
        result["layouts"].append({"name": name(lay), **degrees(lay), "peak_phase": peak(mem)[0], "runnable": runnable(
            lay, shown, args.allow_unbuilt), **{k: {n: v / GIB for n, v in d.items()} for k, d in mem.items()}})
    if best:
        result["recommended"] = {"name": name(best["layout"]), **degrees(best["layout"]), "phase": best["phase"],
                                 "peak_gib": best["peak"] / GIB, "headroom_gib": best["headroom"] / GIB,
                                 "settings": describe(best["plan"])}
        if p.stage == "ppo" and p.device == "gpu":
            result["recommended"]["offload_effect"] = offload_effect(m, best["layout"], best["plan"])
    print(json.dumps(result, indent=1) if args.json else report(params, args, shown, lays, capacity, best, m))
    if best is None:
        raise NoFit(f"no runnable layout of {args.gpus} x {args.gpu_memory_gib:g} GiB fits even with "
                    f"{describe(shown)}; add GPUs, lower --micro-batch / --seq-len, or try --lora-rank")
    return result


def report(params, args, p, lays, capacity, best, m) -> str:
    """The human-readable report: header, table, recommendation with its reasons and the offload effect."""
    lines = [f"model: {params['causal'] / 1e9:.3f}B parameters (score model {params['score'] / 1e9:.3f}B); {p.stage}, "
             f"{p.dtype}, seq {p.seq} (response {p.response}), micro-batch {p.micro}, rollouts {p.rollout}, LoRA "
             f"r={p.lora_rank}; activations {p.formula}"]
    if p.device == "cpu":
        lines.append(f"CPU: fp32, Paddle runtime {p.runtime_bytes / GIB:.2f} GiB RSS included; offload frees nothing")
    lines += [f"{args.gpus} x {args.gpu_memory_gib:g} GiB, usable {capacity / GIB:.1f} GiB each ({args.reserve:.0%} "
              f"reserve); table at: {describe(p)}", "", table(m, lays, p, capacity, args.allow_unbuilt, args.top)]
    if best:
        lay = best["layout"]
        lines += ["", f"recommended: {name(lay)} ({describe(best['plan'])}): peak {best['peak'] / GIB:.2f} GiB in "
                  f"the {best['phase']} phase, headroom {best['headroom'] / GIB:.2f} GiB",
                  f"  why: fewest ranks per model copy (tp x pp, tp <= {args.gpus_per_node}: one node). Tensor "
                  "parallelism all-reduces activations in every layer, forward and backward, so it wants NVLink "
                  "and few ranks; pipelines add bubbles (and here whole generation copies); sharding stages 1-2 and "
                  "data parallelism talk once per step and scale across hosts. Recompute, then offload, only when "
                  "needed; sharding stage 3 (it gathers each layer's weights in every forward and backward) after "
                  "them; then the most headroom."]
        if p.stage == "ppo" and p.device == "gpu":
            lines.append("  offload effect on this layout (GiB per phase):")
            lines += [f"    {r['offload']:<36} generate {r['generate']:7.2f}  score {r['score']:7.2f}  train "
                      f"{r['train']:7.2f}  -> peak {r['peak_phase']}" for r in offload_effect(m, lay, best["plan"])]
    return "\n".join(lines)


def main(argv=None) -> int:
    try:
        run(argv)
    except NoFit as err:
        print(f"plan_layout.py: {err}", file=sys.stderr)
        return 1
    except PlanError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    from alignment.exits import run_program

    sys.exit(run_program(main, uses_paddle=False))
