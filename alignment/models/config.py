"""LlamaConfig: the model hyper-parameters, read from and written to a Hugging Face `config.json`.

One config serves the LLaMA family (LLaMA, SmolLM, Mistral-style GQA), Qwen2 (q/k/v bias), Qwen3 dense (per-head
q/k RMSNorm), ERNIE 4.5 dense (interleaved RoPE, one `use_bias` key for every projection) and the mixture-of-experts
Qwen3-MoE and ERNIE 4.5 MoE (their MoE keys read by alignment/config/moe_keys.py), with RoPE scaling
(`rope_scaling`: linear, dynamic NTK, Llama 3.1, YaRN; see rope.py), following transformers' key names so
checkpoints move both ways between this project, paddleformers and transformers. What sets the families apart is
one row each in FAMILIES (alignment/config/model_families.py).
"""
from __future__ import annotations

import dataclasses
import json
import os
from typing import Any, Optional

from alignment.config.model_families import FAMILIES, SUPPORTED_MODEL_TYPES, Family, family_keys
from alignment.config.model_keys import model_config_problems
from alignment.config.moe_keys import MoeSettings, moe_settings
from alignment.inputs import read_json
from alignment.models import paddlenlp_checkpoint
from alignment.models.rope import RopeConfig, check_rope_scaling

CONFIG_NAME = "config.json"
# never read from or written to config.json
RUNTIME_FIELDS = ("extra", "recompute", "tensor_parallel_degree", "expert_parallel_degree")


@dataclasses.dataclass
class LlamaConfig:
    vocab_size: int = 32000
    hidden_size: int = 4096
    intermediate_size: int = 11008
    num_hidden_layers: int = 32
    num_attention_heads: int = 32
    num_key_value_heads: Optional[int] = None  # None = num_attention_heads (multi-head attention)
    head_dim: Optional[int] = None  # None = hidden_size // num_attention_heads
    max_position_embeddings: int = 2048
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling: Optional[dict] = None  # {"rope_type": "llama3" | "linear" | "dynamic" | "yarn", ...}; see rope.py
    tie_word_embeddings: bool = False
    attention_bias: bool = False  # q/k/v/o bias (LLaMA convention); Qwen2 always has q/k/v bias, see qkv_bias
    mlp_bias: bool = False
    hidden_act: str = "silu"
    initializer_range: float = 0.02
    bos_token_id: Optional[int] = 1
    eos_token_id: Optional[Any] = 2  # int or list of ints
    pad_token_id: Optional[int] = None
    model_type: str = "llama"
    architectures: Optional[list] = None
    recompute: bool = False  # activation checkpointing per decoder layer; a run-time switch, not saved
    tensor_parallel_degree: int = 1  # ranks one model is split over (run time, not saved: checkpoints are whole)
    expert_parallel_degree: int = 1  # ranks each MoE layer's experts are split over (run time, not saved)
    extra: dict = dataclasses.field(default_factory=dict)  # unknown keys from config.json, written back unchanged

    def __post_init__(self):
        if self.num_key_value_heads is None:
            self.num_key_value_heads = self.num_attention_heads
        if self.head_dim is None:
            self.head_dim = self.hidden_size // self.num_attention_heads
        if self.model_type not in SUPPORTED_MODEL_TYPES:
            raise ValueError(f"model_type {self.model_type!r} is not supported; supported: {SUPPORTED_MODEL_TYPES}")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(
                f"num_attention_heads ({self.num_attention_heads}) must be a multiple of "
                f"num_key_value_heads ({self.num_key_value_heads})"
            )
        check_rope_scaling(self.rope_scaling)
        if self.family.bias_key and self.attention_bias != self.mlp_bias:
            raise ValueError(f"model_type {self.model_type!r} has one {self.family.bias_key!r} for the attention and "
                             f"the MLP: attention_bias ({self.attention_bias}) and mlp_bias ({self.mlp_bias}) differ")
        if self.hidden_act != "silu":
            raise ValueError(f"hidden_act {self.hidden_act!r} is not supported (only 'silu' / SwiGLU)")
        moe_settings(self.family.moe, self.extra, self.num_hidden_layers)  # a wrong MoE key: named now

    @property
    def moe(self) -> Optional[MoeSettings]:
        """The mixture-of-experts settings (from the family's keys kept in `extra`); None for a dense model."""
        return moe_settings(self.family.moe, self.extra, self.num_hidden_layers)

    @property
    def family(self) -> Family:
        return FAMILIES[self.model_type]

    @property
    def qkv_bias(self) -> bool:
        return self.family.qkv_bias

    @property
    def qk_norm(self) -> bool:
        return self.family.qk_norm

    @property
    def rope(self) -> RopeConfig:
        return RopeConfig(self.rope_theta, self.rope_scaling, self.max_position_embeddings,
                          self.family.interleaved_rope)

    @property
    def eos_token_ids(self) -> list:
        if self.eos_token_id is None:
            return []
        return list(self.eos_token_id) if isinstance(self.eos_token_id, (list, tuple)) else [self.eos_token_id]

    @classmethod
    def from_dict(cls, data: dict) -> "LlamaConfig":
        if not isinstance(data, dict):
            raise ValueError("a model config must be a JSON object")
        problems = model_config_problems(data)
        if problems:
            raise ValueError("; ".join(problems))
        data = dict(data)
        rope = data.pop("rope_parameters", None)  # transformers 5: theta and scaling in one object
        if isinstance(rope, dict):
            if "rope_theta" in rope:  # over a top-level rope_theta, as transformers 5 and PaddleFormers read them
                data["rope_theta"] = rope["rope_theta"]  # (PaddleFormers 1.2 writes a stale top-level default)
            scaling = {k: v for k, v in rope.items() if k != "rope_theta"}
            if check_rope_scaling(scaling, "rope_parameters") != "default" and data.get("rope_scaling") is None:
                data["rope_scaling"] = scaling
        elif rope is not None:
            raise ValueError(f"key 'rope_parameters' must be a JSON object, got {rope!r}")
        check_rope_scaling(data.get("rope_scaling"))
        if data.pop("use_sliding_window", False):
            raise ValueError("sliding-window attention (use_sliding_window=true) is not supported")
        window = data.get("sliding_window") if data.get("model_type") == "mistral" else None  # Mistral: on if set
        if window is not None and window < data.get("max_position_embeddings", window + 1):
            raise ValueError(f"key 'sliding_window' {window}: sliding-window attention is not supported (attention "
                             f"here is full, so sequences over {window} tokens would differ); set it to null if "
                             "your sequences stay within it")
        data = family_keys(data)
        names = {f.name for f in dataclasses.fields(cls)} - set(RUNTIME_FIELDS)
        known = {k: v for k, v in data.items() if k in names}
        extra = {k: v for k, v in data.items() if k not in names}
        return cls(**known, extra=extra)

    def to_dict(self) -> dict:
        out = dict(self.extra)
        for field in dataclasses.fields(self):
            if field.name not in RUNTIME_FIELDS:
                out[field.name] = getattr(self, field.name)
        out["architectures"] = self.architectures or [self.family.architecture]
        out.setdefault("torch_dtype", "float32")
        if self.family.bias_key:  # one key for both, as the family's own config class reads it
            out[self.family.bias_key] = out.pop("attention_bias")
            del out["mlp_bias"]
        return out

    @classmethod
    def from_pretrained(cls, path: str) -> "LlamaConfig":
        file = os.path.join(path, CONFIG_NAME) if os.path.isdir(path) else path
        if not os.path.exists(file):
            raise FileNotFoundError(f"{file}: no model config found (expected a Hugging Face checkpoint directory)")
        data = read_json(file, "model config")
        try:
            if paddlenlp_checkpoint.is_paddlenlp_checkpoint(os.path.dirname(file)):
                data = paddlenlp_checkpoint.hf_config_dict(data, os.path.dirname(file))  # PaddleNLP's keys -> ours
            return cls.from_dict(data)
        except (TypeError, ValueError) as err:
            raise ValueError(f"{file}: {err}") from err

    def save_pretrained(self, path: str) -> None:
        os.makedirs(path, exist_ok=True)
        with open(os.path.join(path, CONFIG_NAME), "w", encoding="utf-8") as f:
            json.dump(self.to_dict(), f, indent=2, sort_keys=True)
            f.write("\n")


def check_tensor_split(tp: int, config, path: str) -> None:
    """Tensor parallelism splits attention heads, key/value heads, the MLP, each MoE expert and the vocabulary
    evenly; expert parallelism (config.expert_parallel_degree) the experts of an MoE model (a dense model is not
    split by it)."""
    ep, moe = getattr(config, "expert_parallel_degree", 1), getattr(config, "moe", None)
    if ep > 1 and moe is not None and moe.num_experts % ep:
        raise ValueError(f"{path}: {moe.num_experts} experts are not divisible by expert_parallel_degree {ep} "
                         "(key 'expert_parallel_degree')")
    if tp == 1:
        return
    sizes = {"num_attention_heads": config.num_attention_heads, "num_key_value_heads": config.num_key_value_heads,
             "intermediate_size": config.intermediate_size, "vocab_size": config.vocab_size}
    if moe is not None:  # each expert split like the MLP; the shared experts' size is a multiple of it (ERNIE)
        sizes["moe_intermediate_size"] = moe.expert_size
    for name, size in sizes.items():
        if size % tp:
            raise ValueError(f"{path}: {name} {size} is not divisible by tensor_parallel_degree {tp} "
                             "(key 'tensor_parallel_degree')")
