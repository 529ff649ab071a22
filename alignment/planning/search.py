"""Which process layouts exist for a model on N devices, which this toolkit can run, and which one to recommend:
the fewest model-parallel ranks, then the cheapest memory-saving settings, then the most headroom."""
from __future__ import annotations

import math

from alignment.config.choices import OFFLOAD_LEVELS, SHARDING_STAGES
from alignment.parallel.layout import Layout
from alignment.planning.memory import GIB, Model, Plan, PlanError, memory, peak

PINNED = {"tp": "tensor", "pp": "pipeline", "sd": "sharding"}  # the short names `layouts(fixed=...)` takes


class NoFit(PlanError):
    """No runnable layout fits (the CLI exits 1)."""


def degrees(lay: Layout) -> dict:
    """{"tp", "pp", "sd", "stage", "dp"}: a layout under the short names of the report and its JSON."""
    return {"tp": lay.tensor, "pp": lay.pipeline, "sd": lay.sharding, "stage": lay.stage, "dp": lay.data}


def name(lay: Layout) -> str:
    """'tp2 pp1 sd4(stage1) dp1'."""
    return f"tp{lay.tensor} pp{lay.pipeline} sd{lay.sharding}{'(' + lay.stage + ')' if lay.stage else ''} dp{lay.data}"


def divisors(n: int) -> list:
    """The divisors of n, ascending, in O(sqrt n) steps."""
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return small + [n // d for d in reversed(small) if d * d != n]


def allowed_tp(m: Model, n: int) -> list:
    """Tensor degrees dividing n, the heads, kv heads, MLP width and vocabulary."""
    return divisors(math.gcd(n, m.heads, m.kv_heads, m.inter, m.vocab))


def layouts(m: Model, n: int, pipeline: bool = True, fixed: dict = None) -> list:
    """Every (tp, pp, sharding degree, stage, dp) with product n; `fixed` pins tp / pp / sd."""
    if n < 1:
        raise PlanError(f"--gpus must be >= 1, got {n}")
    fixed, out = fixed or {}, []
    for tp in allowed_tp(m, n):
        for pp in [p for p in range(1, min(n // tp, m.layers) + 1) if (n // tp) % p == 0 and (pipeline or p == 1)]:
            rest = n // (tp * pp)
            for sd in divisors(rest):
                for stage in (SHARDING_STAGES[1:] if sd > 1 else ("",)):
                    lay = Layout(n, tp, pp, sd, stage)
                    if all(getattr(lay, PINNED[key]) == value for key, value in fixed.items()):
                        out.append(lay)
    if not out:
        raise PlanError(f"no layout of {n} GPUs for this model with {fixed}: the tensor degree must divide {n} and "
                        f"heads {m.heads}, kv heads {m.kv_heads}, intermediate {m.inter}, vocab {m.vocab} (possible: "
                        f"{allowed_tp(m, n)}); pipeline degree divides {n}/tp, <= {m.layers} layers")
    return out


def runnable(lay: Layout, p: Plan, allow_unbuilt: bool) -> bool:
    """Whether this toolkit runs the layout: sharding stage2/3 not with pipeline parallelism (refused, as in
    PaddleNLP, unless allow_unbuilt); LoRA needs tp = pp = 1."""
    pipelined_zero = lay.stage in ("stage2", "stage3") and lay.pipeline > 1
    return (allow_unbuilt or not pipelined_zero) and not (p.lora_rank and (lay.tensor > 1 or lay.pipeline > 1))


def ladder(p: Plan) -> list:
    """Settings from cheapest to most memory-saving, starting at the requested ones: recompute, then offload."""
    steps = [(False, frozenset())] + [(True, frozenset(OFFLOAD_LEVELS[:k])) for k in range(4)]
    keep = [(rc, off) for rc, off in steps[:5 if p.stage == "ppo" and p.device == "gpu" else 2]
            if rc >= p.recompute and off >= p.offload]
    return keep or [(p.recompute, p.offload)]


STAGE_TIERS = (("", "stage1", "stage2"), ("stage3",))  # stage 3 gathers every layer's weights: the last resort


def recommend(m: Model, lays: list, p: Plan, capacity: float, node: int, allow_unbuilt: bool) -> dict:
    """Fewest model-parallel ranks (tp x pp, tp <= GPUs per node), then pp 1 over pipelines, then sharding up to
    stage 2 (its communication is data parallelism's: once per step) with the cheapest settings of the ladder,
    then stage 3 (it gathers each layer's weights in every forward and backward) likewise, then the most headroom.
    None when nothing fits."""
    for _, pp, tp in sorted({(lay.tensor * lay.pipeline, lay.pipeline, lay.tensor) for lay in lays
                             if lay.tensor <= node}):
        for stages in STAGE_TIERS:
            for rc, off in ladder(p):
                q = p._replace(recompute=rc, offload=off)
                fits = [(capacity - used, lay, phase, used) for lay in lays
                        if (lay.tensor, lay.pipeline) == (tp, pp) and lay.stage in stages
                        and runnable(lay, q, allow_unbuilt)
                        for phase, used in [peak(memory(m, lay, q))] if used <= capacity]
                if fits:
                    room, lay, phase, used = max(fits, key=lambda f: (round(f[0] / GIB, 1), -len(f[1].stage)))
                    return {"layout": lay, "plan": q, "phase": phase, "peak": used, "headroom": room}
    return None


def describe(p: Plan) -> str:
    """The memory-saving settings of a plan, in words."""
    return f"recompute {'full' if p.recompute else 'off'}, offload {' '.join(sorted(p.offload)) or 'none'}"


def offload_effect(m: Model, lay: Layout, p: Plan) -> list:
    """Phase totals (GiB) of one layout for each cumulative offload level (PPO on GPU)."""
    mems = [(" ".join(OFFLOAD_LEVELS[:k]) or "none", memory(m, lay, p._replace(offload=frozenset(OFFLOAD_LEVELS[:k]))))
            for k in range(4)]
    return [{"offload": o, "peak_phase": peak(mem)[0], **{ph: v / GIB for ph, v in mem["phases"].items()}}
            for o, mem in mems]
