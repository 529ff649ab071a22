"""Plan a process layout (tensor x pipeline x sharding x data) for a LLaMA-family model: memory per GPU, per phase.

    python tools/plan_layout.py --model <config.json|HF dir> --gpus N --gpu-memory-gib M [--stage ppo|sft|rm|dpo]
        [--seq-len S] [--micro-batch B] [--rollout-batch R] [--dtype bf16|fp32] [--lora-rank r] [--device cpu] [--json]

Bytes per parameter: bf16 training = bf16 weights and gradients + AdamW's fp32 master weights and 2 moments (12 B);
fp32 = 4 + 4 + 8 B. Sharding (Paddle/PaddleNLP): stage1 splits AdamW states over the sharding ranks, stage2 also
gradients, stage3 also trained weights (frozen models stay whole). tp splits projections, vocabulary, LM head.

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

import collections
import json
import math
import os
import subprocess
import sys

if not __package__:  # run as a script from a checkout: make `alignment` importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from alignment.tool_parser import ToolParser  # noqa: E402
from alignment.config.choices import OFFLOAD_LEVELS, SHARDING_STAGES, parse_offload_levels  # noqa: E402

GIB = 2 ** 30
BUILT_STAGES = ("", "stage1")  # this toolkit's layout check refuses stage2/3 (they need a GPU to be built)
BYTES = {"bf16": {"w": 2, "g": 2, "opt": 12, "act": 2}, "fp32": {"w": 4, "g": 4, "opt": 8, "act": 4}}

Model = collections.namedtuple("Model", "hidden inter layers heads kv_heads head_dim vocab tied qkv_bias o_bias "
                                        "mlp_bias", defaults=(False, False, False, False))
Layout = collections.namedtuple("Layout", "tp pp sd stage dp")  # sd: sharding degree; stage "" or stage1..3
PLAN_DEFAULTS = dict(stage="ppo", seq=512, response=256, micro=8, rollout=8, dtype="bf16", lora_rank=0, recompute=False,
                     offload=frozenset(), eval_mode="tensor_parallel", formula="eager", runtime_bytes=0, device="gpu")
Plan = collections.namedtuple("Plan", PLAN_DEFAULTS, defaults=PLAN_DEFAULTS.values())


class PlanError(ValueError):
    """A bad input (the CLI exits 2)."""


class NoFit(PlanError):
    """No runnable layout fits (the CLI exits 1)."""


def name(lay: Layout) -> str:
    """'tp2 pp1 sd4(stage1) dp1'."""
    return f"tp{lay.tp} pp{lay.pp} sd{lay.sd}{'(' + lay.stage + ')' if lay.stage else ''} dp{lay.dp}"


def load_model(path: str) -> Model:
    """Read a Hugging Face config.json (or a directory holding one) into a Model."""
    file = os.path.join(path, "config.json") if os.path.isdir(path) else path
    if not os.path.isfile(file):
        raise PlanError(f"{file}: no model config found (give a config.json or a Hugging Face checkpoint directory)")
    try:
        with open(file, encoding="utf-8") as f:
            cfg = json.load(f)
        h, heads = int(cfg["hidden_size"]), int(cfg["num_attention_heads"])
        return Model(h, int(cfg["intermediate_size"]), int(cfg["num_hidden_layers"]), heads,
                     int(cfg.get("num_key_value_heads") or heads), int(cfg.get("head_dim") or h // heads),
                     int(cfg["vocab_size"]), bool(cfg.get("tie_word_embeddings", False)),
                     bool(cfg.get("attention_bias")) or cfg.get("model_type") == "qwen2",
                     bool(cfg.get("attention_bias")), bool(cfg.get("mlp_bias")))
    except (json.JSONDecodeError, KeyError, TypeError, ValueError) as err:
        raise PlanError(f"{file}: not a usable model config ({type(err).__name__}: {err})") from err


def projections(m: Model):
    """(in, out, has_bias, column_split) of the seven projections of one decoder layer."""
    q, k = m.heads * m.head_dim, m.kv_heads * m.head_dim
    return [(m.hidden, q, m.qkv_bias, True), (m.hidden, k, m.qkv_bias, True), (m.hidden, k, m.qkv_bias, True),
            (q, m.hidden, m.o_bias, False), (m.hidden, m.inter, m.mlp_bias, True),
            (m.hidden, m.inter, m.mlp_bias, True), (m.inter, m.hidden, m.mlp_bias, False)]


def layer_params(m: Model, tp: int = 1) -> int:
    """Parameters of one decoder layer on one tensor-parallel rank (row-parallel biases are replicated)."""
    n = 2 * m.hidden  # input and post-attention RMSNorm
    for fan_in, fan_out, bias, column in projections(m):
        n += fan_in * fan_out // tp + bias * (fan_out // tp if column else fan_out)
    return n


def model_params(m: Model, kind: str = "causal", tp: int = 1, layers: int = None, first=True, last=True) -> int:
    """Parameters on one rank: `layers` decoder layers, embedding on the first stage, final norm and head on the last
    (LM head unless tied, but a tied table is also held by a later stage; a score model's head is hidden x 1)."""
    n = (m.layers if layers is None else layers) * layer_params(m, tp)
    n += m.vocab * m.hidden // tp if first else 0
    if last:
        n += m.hidden + (m.hidden if kind == "score" else (0 if m.tied and first else m.vocab * m.hidden // tp))
    return n


def stage_params(m: Model, kind: str, tp: int, pp: int) -> int:
    """Parameters of the largest pipeline stage (layers split evenly, as fleet's seg_method layer:...)."""
    per = math.ceil(m.layers / pp)
    return model_params(m, kind, tp) if pp == 1 else max(model_params(m, kind, tp, per, True, False),
                                                          model_params(m, kind, tp, per, False, True))


def lora_params(m: Model, rank: int) -> int:
    """LoRA A and B of all seven projections of every layer."""
    return m.layers * sum(rank * (fan_in + fan_out) for fan_in, fan_out, _, _ in projections(m))


def layer_activation(m: Model, s: int, tp: int, b: int, formula: str) -> float:
    """Bytes kept for backward by one decoder layer, per token (see the module docstring)."""
    h, q, k, i, a = m.hidden, m.heads * m.head_dim, m.kv_heads * m.head_dim, m.inter, m.heads
    if formula == "korthikanti":
        return b / 2 * (h * (10 + 24 / tp) + 5 * a * s / tp)
    gqa = 2 * q if m.kv_heads != m.heads else 0
    split = (q + 2 * k) + 2 * (q + k) + (q + 2 * k) + gqa + 2 * q + 4 * i
    return b * (10 * h + split / tp) + (4 + (b if b < 4 else 0)) * a * s / tp


def logits_bytes(m: Model, tokens: int, tp: int, copies: int = 3) -> float:
    """fp32 logits over `tokens` positions, vocabulary split over tp."""
    return tokens * m.vocab / tp * 4 * copies


def train_activations(m: Model, rows: int, s: int, head_tokens: int, tp: int, pp: int, b: int,
                      recompute: bool, formula: str) -> float:
    """Peak activation bytes of one training micro-batch on the busiest pipeline stage."""
    one_layer = layer_activation(m, s, tp, b, formula) * rows * s
    kept = b * m.hidden * rows * s if recompute else one_layer  # per layer, held until its backward
    q, k = m.heads * m.head_dim, m.kv_heads * m.head_dim  # once per forward: RoPE cos/sin, bias, embedding, norm
    extras = b * (2 * (q + k) / tp + m.heads * s / tp + 4 * m.hidden) * rows * s
    held = math.ceil(m.layers / pp) * kept + extras  # one micro-batch on one stage
    return max(pp * held, held + logits_bytes(m, head_tokens, tp)) + (one_layer if recompute else 0)


def allowed_tp(m: Model, n: int) -> list:
    """Tensor degrees dividing n, the heads, kv heads, MLP width and vocabulary."""
    return [t for t in range(1, n + 1) if n % t == 0 and all(x % t == 0 for x in (m.heads, m.kv_heads, m.inter,
                                                                                   m.vocab))]


def layouts(m: Model, n: int, pipeline: bool = True, fixed: dict = None) -> list:
    """Every (tp, pp, sharding degree, stage, dp) with product n; `fixed` pins tp / pp / sd."""
    if n < 1:
        raise PlanError(f"--gpus must be >= 1, got {n}")
    fixed, out = fixed or {}, []
    for tp in allowed_tp(m, n):
        for pp in [p for p in range(1, min(n // tp, m.layers) + 1) if (n // tp) % p == 0 and (pipeline or p == 1)]:
            rest = n // (tp * pp)
            for sd in [d for d in range(1, rest + 1) if rest % d == 0]:
                for stage in (SHARDING_STAGES[1:] if sd > 1 else ("",)):
                    lay = Layout(tp, pp, sd, stage, rest // sd)
                    if all(getattr(lay, key) == value for key, value in fixed.items()):
                        out.append(lay)
    if not out:
        raise PlanError(f"no layout of {n} GPUs for this model with {fixed}: the tensor degree must divide {n} and "
                        f"heads {m.heads}, kv heads {m.kv_heads}, intermediate {m.inter}, vocab {m.vocab} (possible: "
                        f"{allowed_tp(m, n)}); pipeline degree divides {n}/tp, <= {m.layers} layers")
    return out


def trained_model(m: Model, kind: str, lay: Layout, p: Plan) -> dict:
    """Weights (base + adapters), gradients and AdamW states of one trained model on one GPU."""
    by, whole, sd = BYTES[p.dtype], stage_params(m, kind, lay.tp, lay.pp), lay.sd
    trainable = lora_params(m, p.lora_rank) + (m.hidden if kind == "score" else 0) if p.lora_rank else whole
    weights = (whole + trainable) * by["w"] if p.lora_rank else whole * by["w"] / (sd if lay.stage == "stage3" else 1)
    return {"trained_weights": weights, "grads": trainable * by["g"] / (sd if lay.stage in ("stage2", "stage3") else 1),
            "adamw": trainable * by["opt"] / (sd if lay.stage else 1)}


def memory(m: Model, lay: Layout, p: Plan) -> dict:
    """Per-GPU components (bytes) and the device-resident total of every phase of the stage."""
    b, w, ppo = BYTES[p.dtype]["act"], BYTES[p.dtype]["w"], p.stage == "ppo"
    rows = p.micro * (2 if p.stage in ("rm", "dpo") else 1)  # preference stages: chosen + rejected rows
    head = 0 if p.stage == "rm" else (p.response if ppo or p.stage == "dpo" else p.seq)
    act = [train_activations(m, rows, p.seq, rows * head, lay.tp, lay.pp, b, rc, p.formula) for rc in (0, 1)]
    kinds = ("causal", "score") if ppo else ("score",) if p.stage == "rm" else ("causal",)
    trained = [trained_model(m, kind, lay, p) for kind in kinds]
    ref = model_params(m, "causal", lay.tp) if (ppo or p.stage == "dpo") and not p.lora_rank else 0
    frozen = (ref + (model_params(m, "score", lay.tp) if ppo else 0)) * w
    copies = (model_params(m, "causal") + model_params(m, "score")) * w if ppo and lay.pp > 1 else \
        model_params(m, "causal") * w if ppo and lay.tp > 1 and p.eval_mode == "single" else 0
    gen_tp = 1 if copies else lay.tp
    c = {k: sum(t[k] for t in trained) for k in ("trained_weights", "grads", "adamw")}
    c.update(activations=act[0], activations_recompute=act[1], frozen_models=frozen, whole_copies=copies,
             kv_cache=2 * m.layers * m.kv_heads * m.head_dim * p.seq * p.rollout * b / gen_tp * ppo,  # K and V
             runtime=p.runtime_bytes)
    off = p.offload if p.device == "gpu" else frozenset()  # on CPU the host is the device: offload frees nothing
    base = c["grads"] + copies + c["runtime"]  # gradients keep their buffers between steps
    opt, cold = (0 if "optimizer" in off else c["adamw"]), (0 if "freeze_model" in off else frozen)
    phases = {"train": base + c["adamw"] + c["trained_weights"] + act[p.recompute] + cold}
    if ppo:
        actor_w, critic_w = (t["trained_weights"] for t in trained)
        phases = {"generate": base + opt + actor_w + (0 if "train_model" in off else critic_w) + cold
                  + c["kv_cache"] + layer_activation(m, p.seq, gen_tp, b, p.formula) * p.rollout * p.seq,
                  "score": base + opt + actor_w + critic_w + frozen  # this toolkit brings all four models
                  + layer_activation(m, p.seq, lay.tp, b, p.formula) * p.rollout * p.seq
                  + logits_bytes(m, p.rollout * p.response, lay.tp, copies=2), **phases}
    return {"components": c, "phases": phases}


def peak(mem: dict) -> tuple:
    """(phase, bytes) of the phase with the most device memory."""
    return max(mem["phases"].items(), key=lambda kv: kv[1])


def runnable(lay: Layout, p: Plan, allow_unbuilt: bool) -> bool:
    """Whether this toolkit can run the layout (stage2/3 not built; LoRA needs tp = pp = 1)."""
    return (allow_unbuilt or lay.stage in BUILT_STAGES) and not (p.lora_rank and (lay.tp > 1 or lay.pp > 1))


def ladder(p: Plan) -> list:
    """Settings from cheapest to most memory-saving, starting at the requested ones: recompute, then offload."""
    steps = [(False, frozenset())] + [(True, frozenset(OFFLOAD_LEVELS[:k])) for k in range(4)]
    keep = [(rc, off) for rc, off in steps[:5 if p.stage == "ppo" and p.device == "gpu" else 2]
            if rc >= p.recompute and off >= p.offload]
    return keep or [(p.recompute, p.offload)]


def recommend(m: Model, lays: list, p: Plan, capacity: float, node: int, allow_unbuilt: bool) -> dict:
    """Fewest model-parallel ranks (tp x pp, tp <= GPUs per node), then pp 1 over pipelines, then the cheapest
    settings of the ladder, then the most headroom. None when nothing fits."""
    for _, pp, tp in sorted({(lay.tp * lay.pp, lay.pp, lay.tp) for lay in lays if lay.tp <= node}):
        for rc, off in ladder(p):
            q = p._replace(recompute=rc, offload=off)
            fits = [(capacity - used, lay, phase, used) for lay in lays
                    if (lay.tp, lay.pp) == (tp, pp) and runnable(lay, q, allow_unbuilt)
                    for phase, used in [peak(memory(m, lay, q))] if used <= capacity]
            if fits:
                room, lay, phase, used = max(fits, key=lambda f: (round(f[0] / GIB, 1), -len(f[1].stage)))
                return {"layout": lay, "plan": q, "phase": phase, "peak": used, "headroom": room}
    return None


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


def describe(p: Plan) -> str:
    """The memory-saving settings of a plan, in words."""
    return f"recompute {'full' if p.recompute else 'off'}, offload {' '.join(sorted(p.offload)) or 'none'}"


def offload_effect(m: Model, lay: Layout, p: Plan) -> list:
    """Phase totals (GiB) of one layout for each cumulative offload level (PPO on GPU)."""
    mems = [(" ".join(OFFLOAD_LEVELS[:k]) or "none", memory(m, lay, p._replace(offload=frozenset(OFFLOAD_LEVELS[:k]))))
            for k in range(4)]
    return [{"offload": o, "peak_phase": peak(mem)[0], **{ph: v / GIB for ph, v in mem["phases"].items()}}
            for o, mem in mems]


def parse_args(argv):
    """The command line (see the module docstring)."""
    ap = ToolParser(__doc__)
    add = ap.add_argument
    add("--model", required=True, help="config.json or a Hugging Face checkpoint directory")
    add("--gpus", type=int, required=True)
    add("--gpu-memory-gib", type=float, required=True, help="memory per GPU (per process with --device cpu)")
    add("--gpus-per-node", type=int, default=8, help="tensor parallelism stays within a node")
    add("--stage", choices=("ppo", "sft", "rm", "dpo"), default="ppo")
    add("--seq-len", type=int, default=512, help="tokens per row (PPO: prompt + response)")
    add("--response-len", type=int, help="tokens generated / through the LM head (default: seq/2, SFT: seq)")
    add("--micro-batch", type=int, default=8, help="rows per device per micro-batch (RM/DPO: pairs)")
    add("--rollout-batch", type=int, default=8, help="PPO rollouts generated per device")
    add("--dtype", choices=("bf16", "fp32"), default="bf16")
    add("--lora-rank", type=int, default=0, help="LoRA on all projections (PPO: actor and critic)")
    add("--recompute", action="store_true", help="require full recompute (otherwise added only when needed)")
    add("--offload", default="", help="PPO offload levels to require, e.g. 'freeze_model optimizer'")
    add("--eval-mode", choices=("tensor_parallel", "single"), default="tensor_parallel")
    add("--activations", choices=("eager", "korthikanti"), default="eager")
    add("--device", choices=("gpu", "cpu"), default="gpu", help="cpu: fp32 + the measured Paddle runtime RSS")
    add("--runtime-gib", type=float, help="CPU runtime RSS to use instead of measuring it")
    add("--reserve", type=float, default=0.1, help="fraction kept free (CUDA context, NCCL, fragmentation)")
    for flag in ("--tp", "--pp", "--sharding-degree"):
        add(flag, type=int, help="pin this degree")
    add("--allow-unbuilt", action="store_true", help="also recommend sharding stage2/3 (not built in this toolkit)")
    add("--top", type=int, default=30, help="rows of the printed table")
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
                args.activations, runtime * GIB, args.device)


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
        result["layouts"].append({"name": name(lay), **lay._asdict(), "peak_phase": peak(mem)[0], "runnable": runnable(
            lay, shown, args.allow_unbuilt), **{k: {n: v / GIB for n, v in d.items()} for k, d in mem.items()}})
    if best:
        result["recommended"] = {"name": name(best["layout"]), **best["layout"]._asdict(), "phase": best["phase"],
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
                  "and few ranks; pipelines add bubbles (and here whole generation copies); sharding stage1 and "
                  "data parallelism talk once per step and scale across hosts. Recompute, then offload, only when "
                  "needed; then the most headroom."]
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
        print(f"plan_layout.py: error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
