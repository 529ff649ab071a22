"""The model families one LlamaConfig serves (alignment/models/config.py), one row each: what a `model_type` changes
in the LLaMA architecture and in its config.json. Plain data, so building a model and planning its memory
(alignment/planning/memory.py) read the same table."""
from __future__ import annotations

import json
from typing import Any, NamedTuple, Optional, Tuple


class Family(NamedTuple):
    """What a model_type changes in the LLaMA architecture and in its config.json."""
    architecture: str  # transformers' causal-LM class, written to `architectures`
    sequence_classification: Optional[str] = None  # transformers' score-head class (None: transformers has none)
    qkv_bias: bool = False  # q/k/v biases whatever attention_bias says (Qwen2)
    qk_norm: bool = False  # per-head RMSNorm on q and k before RoPE (Qwen3)
    interleaved_rope: bool = False  # RoPE rotates pairs (2i, 2i + 1), not halves (i, i + d/2) (ERNIE 4.5)
    bias_key: Optional[str] = None  # one config key for the q/k/v/o and MLP biases (ERNIE's `use_bias`)
    fixed: Tuple[Tuple[str, Any], ...] = ()  # (key, the only value we support) when the key is present
    moe: Optional[str] = None  # mixture-of-experts keys and routing (a reader in moe_keys.py); None: dense


FAMILIES = {
    "llama": Family("LlamaForCausalLM", "LlamaForSequenceClassification"),
    "qwen2": Family("Qwen2ForCausalLM", "Qwen2ForSequenceClassification", qkv_bias=True),
    "mistral": Family("MistralForCausalLM", "MistralForSequenceClassification"),
    "qwen3": Family("Qwen3ForCausalLM", "Qwen3ForSequenceClassification", qk_norm=True),
    # PaddleFormers' keys: positions divided by compression_ratio, LayerNorm instead of RMSNorm when not use_rmsnorm
    "ernie4_5": Family("Ernie4_5ForCausalLM", interleaved_rope=True, bias_key="use_bias",
                       fixed=(("compression_ratio", 1.0), ("use_rmsnorm", True))),
    "qwen3_moe": Family("Qwen3MoeForCausalLM", "Qwen3MoeForSequenceClassification", qk_norm=True, moe="qwen3_moe"),
    "ernie4_5_moe": Family("Ernie4_5_MoeForCausalLM", interleaved_rope=True, bias_key="use_bias", moe="ernie4_5_moe",
                           fixed=(("compression_ratio", 1.0), ("use_rmsnorm", True))),
}
SUPPORTED_MODEL_TYPES = tuple(FAMILIES)


def family_keys(data: dict) -> dict:
    """The family's own keys -> ours: a bias key sets attention_bias and mlp_bias; a fixed key with another value
    is refused, naming it."""
    family = FAMILIES.get(data.get("model_type", "llama"))
    if family is None:
        return data  # refused in __post_init__, naming the supported types
    for key, value in family.fixed:
        if key in data and data[key] != value:
            raise ValueError(f"key {key!r} {json.dumps(data[key])} is not supported for model_type "
                             f"{data['model_type']!r} (only {json.dumps(value)})")
    if family.bias_key and family.bias_key in data:
        bias = data.pop(family.bias_key)
        if not isinstance(bias, bool):
            raise ValueError(f"key {family.bias_key!r} must be true or false, got {bias!r}")
        data["attention_bias"] = data["mlp_bias"] = bias
    return data
