"""Device memory of one rank under a process layout, per phase (generate, score, train) of a training stage.

The formulas (bytes per parameter, activations per layer and token, logits, KV cache, what each sharding stage
splits and gathers, what each offload level moves to the host) are spelled out in `python tools/plan_layout.py --help`
(alignment/commands/plan_layout.py). A layout is alignment.parallel.layout.Layout, as `plan()` builds it for a run.
"""
from __future__ import annotations

import collections
import math
import os

from alignment.config.model_families import FAMILIES, family_keys
from alignment.config.model_keys import model_config_problems
from alignment.inputs import read_json
from alignment.parallel.layout import Layout

GIB = 2 ** 30
BYTES = {"bf16": {"w": 2, "g": 2, "opt": 12, "act": 2}, "fp32": {"w": 4, "g": 4, "opt": 8, "act": 4}}

Model = collections.namedtuple("Model", "hidden inter layers heads kv_heads head_dim vocab tied qkv_bias o_bias "
                                        "mlp_bias", defaults=(False, False, False, False))
PLAN_DEFAULTS = dict(stage="ppo", seq=512, response=256, micro=8, rollout=8, dtype="bf16", lora_rank=0, recompute=False,
                     offload=frozenset(), eval_mode="tensor_parallel", formula="eager", runtime_bytes=0, device="gpu",
                     segment=2**20)
GRAD_BUCKET = 2**23  # Paddle's stage-2 gradient buffer per rank (group_sharded_parallel's buffer_max_size, elements)
Plan = collections.namedtuple("Plan", PLAN_DEFAULTS, defaults=PLAN_DEFAULTS.values())


class PlanError(ValueError):
    """A bad input (the CLI exits 2)."""


def load_model(path: str) -> Model:
    """Read a Hugging Face config.json (or a directory holding one) into a Model; its keys are checked as for
    building the model (alignment/config/model_keys.py)."""
    file = os.path.join(path, "config.json") if os.path.isdir(path) else path
    if not os.path.isfile(file):
        raise PlanError(f"{file}: no model config found (give a config.json or a Hugging Face checkpoint directory)")
    try:
        cfg = read_json(file, "model config")
    except ValueError as err:  # InputError: it names the file and line
        raise PlanError(str(err)) from None
    problems = model_config_problems(cfg) if isinstance(cfg, dict) else ["a model config must be a JSON object"]
    if problems:
        raise PlanError(f"{file}: " + "; ".join(problems))
    try:
        cfg = family_keys(dict(cfg))  # ERNIE's use_bias -> attention_bias and mlp_bias
    except ValueError as err:
        raise PlanError(f"{file}: {err}") from None
    family = FAMILIES.get(cfg.get("model_type", "llama"), FAMILIES["llama"])
    h, heads = cfg["hidden_size"], cfg["num_attention_heads"]
    return Model(h, cfg["intermediate_size"], cfg["num_hidden_layers"], heads, cfg.get("num_key_value_heads") or heads,
                 cfg.get("head_dim") or h // heads, cfg["vocab_size"], bool(cfg.get("tie_word_embeddings", False)),
                 bool(cfg.get("attention_bias")) or family.qkv_bias, bool(cfg.get("attention_bias")),
                 bool(cfg.get("mlp_bias")))


def projections(m: Model):
    """(in, out, has_bias, column_split) of the seven projections of one decoder layer."""
    q, k = m.heads * m.head_dim, m.kv_heads * m.head_dim
    return [(m.hidden, q, m.qkv_bias, True), (m.hidden, k, m.qkv_bias, True), (m.hidden, k, m.qkv_bias, True),
            (q, m.hidden, m.o_bias, False), (m.hidden, m.inter, m.mlp_bias, True),
            (m.hidden, m.inter, m.mlp_bias, True), (m.inter, m.hidden, m.mlp_bias, False)]


def layer_tensors(m: Model, tp: int = 1) -> list:
    """Element counts of one decoder layer's parameters on one tensor-parallel rank (row-parallel biases are
    replicated): two RMSNorms, seven projections and their biases."""
    sizes = [m.hidden, m.hidden]
    for fan_in, fan_out, bias, column in projections(m):
        sizes += [fan_in * fan_out // tp] + ([fan_out // tp if column else fan_out] if bias else [])
    return sizes


def layer_params(m: Model, tp: int = 1) -> int:
    """Parameters of one decoder layer on one tensor-parallel rank."""
    return sum(layer_tensors(m, tp))


def model_tensors(m: Model, kind: str = "causal", tp: int = 1, layers: int = None, first=True, last=True) -> list:
    """Element counts of the parameters on one rank: `layers` decoder layers, the embedding on the first stage,
    final norm and head on the last (LM head unless tied, but a tied table is also held by a later stage; a score
    model's head is hidden x 1). The embedding comes last."""
    sizes = layer_tensors(m, tp) * (m.layers if layers is None else layers)
    if last:
        sizes += [m.hidden] + ([m.hidden] if kind == "score" else [] if m.tied and first else [m.vocab * m.hidden // tp])
    return sizes + ([m.vocab * m.hidden // tp] if first else [])


def model_params(m: Model, kind: str = "causal", tp: int = 1, layers: int = None, first=True, last=True) -> int:
    """Parameters on one rank (model_tensors summed)."""
    return sum(model_tensors(m, kind, tp, layers, first, last))


def stage_tensors(m: Model, kind: str, tp: int, pp: int) -> list:
    """Element counts of the parameters of the largest pipeline stage (layers split evenly, as fleet's
    seg_method layer:...)."""
    per = math.ceil(m.layers / pp)
    if pp == 1:
        return model_tensors(m, kind, tp)
    return max(model_tensors(m, kind, tp, per, True, False), model_tensors(m, kind, tp, per, False, True), key=sum)


def stage_params(m: Model, kind: str, tp: int, pp: int) -> int:
    """Parameters of the largest pipeline stage."""
    return sum(stage_tensors(m, kind, tp, pp))


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


def stage3_split(m: Model, kind: str, lay: Layout, p: Plan) -> tuple:
    """(parameters stage 3 slices, those it keeps whole, the largest sliced tensor): tensors above the segment size
    are sliced, except a tied embedding table of a causal LM (its head reads the table outside the embedding
    layer, alignment/training/sharding.py); everything else stays whole on every rank."""
    sizes = stage_tensors(m, kind, lay.tensor, lay.pipeline)
    table = m.vocab * m.hidden // lay.tensor if kind == "causal" and m.tied else None
    sliced = [t for i, t in enumerate(sizes) if t > p.segment and not (t == table and i == len(sizes) - 1)]
    return sum(sliced), sum(sizes) - sum(sliced), max(sliced, default=0)


def trained_model(m: Model, kind: str, lay: Layout, p: Plan) -> dict:
    """Weights (base + adapters), gradients and AdamW states of one trained model on one rank, and what one step
    holds besides (`gathered`): stage 2 the other ranks' gradient buffers during backward (each up to
    GRAD_BUCKET elements), stage 3 the largest sliced tensor and its gradient whole while its layer runs. Stage 3
    frees its gradient slices after each step (`grads_released`): they build up in backward as the activations are
    freed, so a step holds the larger of the two, not both (measured: benchmarks/bench_sharding_memory.py)."""
    by, sd = BYTES[p.dtype], lay.sharding
    stage = lay.stage if sd > 1 else ""
    whole = stage_params(m, kind, lay.tensor, lay.pipeline)
    trainable = lora_params(m, p.lora_rank) + (m.hidden if kind == "score" else 0) if p.lora_rank else whole
    base, gathered, released = whole, 0.0, 0.0  # the (frozen under LoRA) weights each rank holds
    if stage == "stage3":
        sliced, kept, largest = stage3_split(m, kind, lay, p)
        base, gathered = kept + sliced / sd, 2 * largest * by["w"]
        released = 0.0 if p.lora_rank else sliced / sd * by["g"]  # a LoRA run's slices are frozen: no gradient
    split = {"": 1, "stage1": 1, "stage2": sd, "stage3": sd}[stage]  # what divides the gradients
    grads, opt = trainable / split, trainable / (sd if stage else 1)
    if p.lora_rank:  # the adapters are small: whole on every rank under stage 3 (their states too)
        weights = base + trainable
        grads, opt = (trainable, trainable) if stage == "stage3" else (grads, opt)
    else:
        weights = base
        grads, opt = (base, base) if stage == "stage3" else (grads, opt)
    if stage == "stage2":
        gathered = (sd - 1) * min(GRAD_BUCKET, trainable / sd) * by["g"]
    return {"trained_weights": weights * by["w"], "grads": grads * by["g"], "adamw": opt * by["opt"],
            "gathered": gathered, "grads_released": released}


def memory(m: Model, lay: Layout, p: Plan) -> dict:
    """Per-GPU components (bytes) and the device-resident total of every phase of the stage."""
    b, w, ppo = BYTES[p.dtype]["act"], BYTES[p.dtype]["w"], p.stage == "ppo"
    rows = p.micro * (2 if p.stage in ("rm", "dpo") else 1)  # preference stages: chosen + rejected rows
    head = 0 if p.stage == "rm" else (p.response if ppo or p.stage == "dpo" else p.seq)
    act = [train_activations(m, rows, p.seq, rows * head, lay.tensor, lay.pipeline, b, rc, p.formula) for rc in (0, 1)]
    kinds = ("causal", "score") if ppo else ("score",) if p.stage == "rm" else ("causal",)
    trained = [trained_model(m, kind, lay, p) for kind in kinds]
    ref = model_params(m, "causal", lay.tensor) if (ppo or p.stage == "dpo") and not p.lora_rank else 0
    frozen = (ref + (model_params(m, "score", lay.tensor) if ppo else 0)) * w
    sliced = lay.stage == "stage3" and lay.sharding > 1  # PPO then generates from a whole copy of the actor
    copies = (model_params(m, "causal") + model_params(m, "score")) * w if ppo and lay.pipeline > 1 else \
        model_params(m, "causal") * w if ppo and (lay.tensor > 1 and p.eval_mode == "single" or sliced) else 0
    gen_tp = 1 if copies else lay.tensor
    c = {k: sum(t[k] for t in trained) for k in ("trained_weights", "grads", "adamw", "gathered", "grads_released")}
    c.update(activations=act[0], activations_recompute=act[1], frozen_models=frozen, whole_copies=copies,
             kv_cache=2 * m.layers * m.kv_heads * m.head_dim * p.seq * p.rollout * b / gen_tp * ppo,  # K and V
             runtime=p.runtime_bytes)
    off = p.offload if p.device == "gpu" else frozenset()  # on CPU the host is the device: offload frees nothing
    base = c["grads"] - c["grads_released"] + copies + c["runtime"]  # gradients keep their buffers between steps
    opt, cold = (0 if "optimizer" in off else c["adamw"]), (0 if "freeze_model" in off else frozen)
    phases = {"train": base + c["adamw"] + c["trained_weights"] + c["gathered"] + cold
              + max(act[p.recompute], c["grads_released"])}
    if ppo:
        actor_w, critic_w = (t["trained_weights"] for t in trained)
        phases = {"generate": base + opt + actor_w + (0 if "train_model" in off else critic_w) + cold
                  + c["kv_cache"] + layer_activation(m, p.seq, gen_tp, b, p.formula) * p.rollout * p.seq,
                  "score": base + opt + actor_w + critic_w + frozen  # this toolkit brings all four models
                  + layer_activation(m, p.seq, lay.tensor, b, p.formula) * p.rollout * p.seq
                  + logits_bytes(m, p.rollout * p.response, lay.tensor, copies=2), **phases}
    return {"components": c, "phases": phases}


def peak(mem: dict) -> tuple:
    """(phase, bytes) of the phase with the most device memory."""
    return max(mem["phases"].items(), key=lambda kv: kv[1])
