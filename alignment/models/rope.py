"""Rotary position embeddings (RoPE): the inverse frequencies of each rope type, and the cos / sin tables that q
and k are rotated with. Two layouts of a head's d features: HF's rotate-half (LLaMA, Qwen: feature i turns with
feature i + d/2, both halves share the frequencies) and interleaved (ERNIE 4.5, GPT-J: feature 2i with 2i + 1, each
frequency repeated for its pair), `RopeConfig.interleaved`.

config.json's `rope_scaling` (transformers 5 writes it inside `rope_parameters`) names the type by `rope_type` or
the legacy `type`. Each type is a pure function in ROPE_TYPES, computed as transformers' ROPE_INIT_FUNCTIONS are, in
float32: (scaling, head_dim, theta, max_positions, position_ids [b, s]) -> (inv_freq [1, d/2] or [b, d/2],
attention_factor). The attention factor multiplies cos and sin (YaRN's mscale), so q.k scales by its square.

Dynamic NTK depends on the length: each row's largest position + 1, at least max_position_embeddings (its original
length in transformers). transformers takes the whole batch's largest position and keeps the longest length seen
between calls until a call is shorter than the original again; per row, a sequence's numbers do not depend on the
other rows (the decode engine's rule), and a single sequence, prefilled then decoded, gets transformers' numbers.
"""
from __future__ import annotations

import math
from typing import Callable, Dict, NamedTuple, Optional, Tuple

import numpy as np
import paddle

from alignment import cpu_kernels as kernels


class RopeConfig(NamedTuple):
    theta: float  # rope_theta
    scaling: Optional[dict] = None  # config.json's rope_scaling (None: plain RoPE)
    max_positions: int = 2048  # max_position_embeddings (dynamic NTK's original length, YaRN's default one)
    interleaved: bool = False  # pairs (2i, 2i + 1) rotate, not halves (i, i + d/2)


def _exponents(head_dim: int):
    """[d/2] float32: 2i / d, as transformers computes them (int64 arange, then float)."""
    return paddle.arange(0, head_dim, 2, dtype="int64").astype("float32") / head_dim


def default_rope(scaling, head_dim, theta, max_positions, position_ids):
    return (1.0 / (theta ** _exponents(head_dim))).unsqueeze(0), 1.0  # [1, d/2]


def linear_rope(scaling, head_dim, theta, max_positions, position_ids):
    """Position interpolation: every frequency divided by `factor`."""
    inv_freq, _ = default_rope(scaling, head_dim, theta, max_positions, position_ids)
    return inv_freq / float(scaling["factor"]), 1.0  # [1, d/2]


def dynamic_ntk_rope(scaling, head_dim, theta, max_positions, position_ids):
    """NTK-aware base rescaled per row once its length passes max_positions: theta (factor L / max - factor + 1)
    ^ (d / (d - 2)); plain RoPE up to max_positions."""
    factor = float(scaling["factor"])
    length = position_ids.max(axis=1, keepdim=True).astype("float32") + 1.0  # [b, 1]
    length = paddle.clip(length, min=float(max_positions))
    base = theta * ((factor * length / max_positions) - (factor - 1)) ** (head_dim / (head_dim - 2))  # [b, 1]
    return 1.0 / (base ** _exponents(head_dim)), 1.0  # [b, d/2]


def llama3_rope(scaling, head_dim, theta, max_positions, position_ids):
    """Llama 3.1: wavelengths beyond original / low_freq_factor divided by `factor`, those below original /
    high_freq_factor kept, a smooth blend between."""
    inv_freq, _ = default_rope(scaling, head_dim, theta, max_positions, position_ids)  # [1, d/2]
    factor, low, high = (float(scaling[k]) for k in ("factor", "low_freq_factor", "high_freq_factor"))
    old_context = scaling["original_max_position_embeddings"]
    low_wavelen, high_wavelen = old_context / low, old_context / high
    wavelen = 2 * math.pi / inv_freq
    scaled = paddle.where(wavelen > low_wavelen, inv_freq / factor, inv_freq)
    smooth = (old_context / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = paddle.logical_not(wavelen < high_wavelen) & paddle.logical_not(wavelen > low_wavelen)
    return paddle.where(medium, smoothed, scaled), 1.0  # [1, d/2]


def yarn_mscale(scale: float, mscale: float = 1.0) -> float:
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def yarn_attention_factor(scaling: dict, factor: float) -> float:
    """`attention_factor` if given, else mscale(factor, mscale) / mscale(factor, mscale_all_dim) when both are set,
    else 0.1 ln(factor) + 1 (transformers' rule)."""
    if scaling.get("attention_factor") is not None:
        return float(scaling["attention_factor"])
    mscale, mscale_all_dim = scaling.get("mscale"), scaling.get("mscale_all_dim")
    if mscale and mscale_all_dim:
        return float(yarn_mscale(factor, mscale) / yarn_mscale(factor, mscale_all_dim))
    return yarn_mscale(factor)


def yarn_rope(scaling, head_dim, theta, max_positions, position_ids):
    """YaRN: frequencies that turn fewer than beta_slow times over the original length are interpolated (divided by
    `factor`), those turning more than beta_fast times kept, a linear ramp between; cos, sin scaled by the
    attention factor."""
    original = scaling.get("original_max_position_embeddings") or max_positions  # transformers' default
    factor = float(scaling["factor"])
    beta_fast, beta_slow = scaling.get("beta_fast") or 32, scaling.get("beta_slow") or 1

    def correction_dim(rotations):  # the dimension that turns `rotations` times over the original length
        return (head_dim * math.log(original / (rotations * 2 * math.pi))) / (2 * math.log(theta))

    low, high = correction_dim(beta_fast), correction_dim(beta_slow)
    if scaling.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, head_dim - 1)
    high = high + 0.001 if low == high else high  # transformers' guard against a zero-width ramp
    pos_freqs = theta ** _exponents(head_dim)  # [d/2]
    ramp = paddle.clip((paddle.arange(head_dim // 2, dtype="float32") - low) / (high - low), 0.0, 1.0)  # [d/2]
    extrapolation = 1 - ramp
    inv_freq = (1.0 / (factor * pos_freqs)) * (1 - extrapolation) + (1.0 / pos_freqs) * extrapolation
    return inv_freq.unsqueeze(0), yarn_attention_factor(scaling, factor)  # [1, d/2]


RopeFn = Callable[[dict, int, float, int, paddle.Tensor], Tuple[paddle.Tensor, float]]
ROPE_TYPES: Dict[str, RopeFn] = {"default": default_rope, "linear": linear_rope, "dynamic": dynamic_ntk_rope,
                                 "llama3": llama3_rope, "yarn": yarn_rope}
REQUIRED = {"linear": ("factor",), "dynamic": ("factor",), "yarn": ("factor",),
            "llama3": ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")}
NUMBERS = ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings", "beta_fast",
           "beta_slow", "mscale", "mscale_all_dim", "attention_factor")


def rope_type(scaling: Optional[dict]) -> str:
    return "default" if not scaling else scaling.get("rope_type", scaling.get("type")) or "default"


def check_rope_scaling(scaling, key: str = "rope_scaling") -> str:
    """The rope type of config.json's `key`; a ValueError naming the key for an unknown type (and the supported
    ones), a missing or non-positive parameter, or a partial rotary factor."""
    if scaling is not None and not isinstance(scaling, dict):
        raise ValueError(f"key {key!r} must be a JSON object or null, got {scaling!r}")
    kind = rope_type(scaling)
    if kind not in ROPE_TYPES:
        raise ValueError(f"key {key!r}: rope_type {kind!r} is not supported (supported: {', '.join(ROPE_TYPES)})")
    scaling = scaling or {}
    for name in REQUIRED.get(kind, ()):
        if scaling.get(name) is None:
            raise ValueError(f"key {key!r}: rope_type {kind!r} needs {name!r}")
    for name in NUMBERS:
        value = scaling.get(name)
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float)) or
                                  not math.isfinite(value) or value <= 0):
            raise ValueError(f"key {key!r}: {name!r} must be a positive number, got {value!r}")
    if kind == "llama3" and scaling["high_freq_factor"] <= scaling["low_freq_factor"]:
        raise ValueError(f"key {key!r}: 'high_freq_factor' must be larger than 'low_freq_factor'")
    if scaling.get("partial_rotary_factor", 1.0) != 1.0:
        raise ValueError(f"key {key!r}: partial_rotary_factor {scaling['partial_rotary_factor']!r} is not supported "
                         "(only 1.0: every dimension of a head rotates)")
    return kind


def rope_cos_sin(position_ids, head_dim: int, rope: RopeConfig, dtype):
    """position_ids [b, s] -> cos, sin [b, s, 1, d] (times the type's attention factor)."""
    fn = ROPE_TYPES[rope_type(rope.scaling)]
    inv_freq, attention_factor = fn(rope.scaling, head_dim, rope.theta, rope.max_positions, position_ids)
    freqs = position_ids.astype("float32").unsqueeze(-1) * inv_freq.unsqueeze(1)  # [b, s, d/2]
    if rope.interleaved:  # f0 f0 f1 f1 ...
        emb = paddle.stack([freqs, freqs], axis=-1).flatten(start_axis=2).unsqueeze(2)  # [b, s, 1, d]
    else:  # f0 f1 ... f0 f1 ...
        emb = paddle.concat([freqs, freqs], axis=-1).unsqueeze(2)  # [b, s, 1, d]
    cos, sin = emb.cos(), emb.sin()
    if attention_factor != 1.0:
        cos, sin = paddle.scale(cos, attention_factor), paddle.scale(sin, attention_factor)
    return (cos, sin) if dtype == paddle.float32 else (cos.astype(dtype), sin.astype(dtype))


class Rotary(NamedTuple):
    """RoPE tables built once per forward: cos, sin [b, s, heads, d] for q and for k, already expanded over the
    heads (same-shape multiplies were ~7x faster than broadcasting ones on CPU, forward and backward; measured),
    and `rotate` [d, d], the layout's rotate-half as a signed permutation matrix, so rotate_half(x) = x @ rotate is
    one exact matmul instead of a split, a negation and a concat. q's tables carry attention's 1 / sqrt(d), so the
    scores need no scaling pass (exact when d is a power of 4). q and k are rotated separately: concatenating
    them for one rotation and splitting after took 3.1 vs 2.1 ms forward + backward at [16, 46, 4 + 4, 64] and
    9.7 vs 6.2 ms at SmolLM2's [8, 128, 9 + 3, 64] (the same values bit for bit; measured)."""
    cos_q: paddle.Tensor
    sin_q: paddle.Tensor
    cos_k: paddle.Tensor
    sin_k: paddle.Tensor
    rotate: paddle.Tensor
    interleaved: bool = False  # RopeConfig.interleaved: the layout `rotate` is of


def rotary_tables(position_ids, head_dim: int, rope: RopeConfig, dtype, q_heads: int, kv_heads: int) -> Rotary:
    """position_ids [b, s] -> Rotary for q_heads and kv_heads heads; q's tables scaled by 1 / sqrt(head_dim)."""
    cos, sin = rope_cos_sin(position_ids, head_dim, rope, paddle.float32)  # [b, s, 1, d]
    b, s = position_ids.shape
    scale = 1.0 / math.sqrt(head_dim)

    def per_head(table, heads):  # [b, s, 1, d] float32 -> [b, s, heads, d] in dtype
        table = paddle.expand(table, [b, s, heads, head_dim])
        return table if dtype == paddle.float32 else table.astype(dtype)

    # q's tables are scaled in float32, before any cast to a half-precision dtype (one rounding)
    return Rotary(per_head(paddle.scale(cos, scale), q_heads), per_head(paddle.scale(sin, scale), q_heads),
                  per_head(cos, kv_heads), per_head(sin, kv_heads),
                  rotate_half_matrix(head_dim, dtype, rope.interleaved), rope.interleaved)


def rotate_half_matrix(head_dim: int, dtype, interleaved: bool = False) -> paddle.Tensor:
    """[d, d]: rotate-half as a signed permutation, rotate_half(x) = x @ it (exact: one nonzero per column).
    HF's layout: out[i] = -x[i + d/2], out[i + d/2] = x[i]; interleaved: out[2i] = -x[2i + 1], out[2i + 1] = x[2i]."""
    half = np.arange(head_dim // 2)
    first, second = (2 * half, 2 * half + 1) if interleaved else (half, half + head_dim // 2)
    rotate = np.zeros([head_dim, head_dim], dtype="float32")
    rotate[first, second] = 1.0  # out[second] = x[first]
    rotate[second, first] = -1.0  # out[first] = -x[second]
    return paddle.to_tensor(rotate).astype(dtype)


def apply_rope(x, cos, sin, rotate):
    """x [b, s, heads, d]; cos, sin: the Rotary tables of these heads."""
    return x * cos + paddle.matmul(x, rotate) * sin


def rope_heads_first(x, cos, sin, rotary: Rotary):
    """apply_rope, then x [b, s, heads, d] -> [b, heads, s, d]: our CPU kernel where chosen (the same bits), else
    Paddle's operations."""
    fused = kernels.rope(x, cos, sin, rotary.interleaved)
    return apply_rope(x, cos, sin, rotary.rotate).transpose([0, 2, 1, 3]) if fused is None else fused
