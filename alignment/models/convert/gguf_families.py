"""What a GGUF file's `general.architecture` is in Hugging Face terms, one row per architecture: the model_type
(a row of alignment/config/model_families.py), the tensors each layer holds, the config.json keys that have one
value or come from `<architecture>.*` metadata, and whether llama.cpp's convert_hf_to_gguf.py permuted q/k rows.
Tensor names are gguf-py's (gguf/constants.py TENSOR_NAMES), HF names transformers' `save_pretrained` ones. The
functions below read these tables for from_gguf.py and return problems as text (it names the file)."""
from __future__ import annotations

from typing import Any, Dict, Iterable, List, NamedTuple, Optional, Tuple

import gguf
import numpy as np

from alignment.config.model_families import FAMILIES
from alignment.config.moe_keys import moe_settings

GLOBAL_TENSORS = {"token_embd.weight": "model.embed_tokens.weight", "output_norm.weight": "model.norm.weight",
                  "output.weight": "lm_head.weight"}
# blk.N.<GGUF name> -> model.layers.N.<HF name>
LAYER_TENSORS = {
    "attn_norm.weight": "input_layernorm.weight", "attn_q.weight": "self_attn.q_proj.weight",
    "attn_k.weight": "self_attn.k_proj.weight", "attn_v.weight": "self_attn.v_proj.weight",
    "attn_output.weight": "self_attn.o_proj.weight", "attn_q.bias": "self_attn.q_proj.bias",
    "attn_k.bias": "self_attn.k_proj.bias", "attn_v.bias": "self_attn.v_proj.bias",
    "attn_q_norm.weight": "self_attn.q_norm.weight", "attn_k_norm.weight": "self_attn.k_norm.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight", "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight", "ffn_down.weight": "mlp.down_proj.weight",
    "ffn_gate_inp.weight": "mlp.gate.weight", "ffn_gate_shexp.weight": "mlp.shared_experts.gate_proj.weight",
    "ffn_up_shexp.weight": "mlp.shared_experts.up_proj.weight",
    "ffn_down_shexp.weight": "mlp.shared_experts.down_proj.weight",
    "exp_probs_b.bias": "mlp.moe_statics.e_score_correction_bias",
}
# [experts, out, in] stacks (the converter's torch.stack of the per-expert weights) -> mlp.experts.<e>.<name>.weight
STACKED_EXPERTS = {"ffn_gate_exps.weight": "gate_proj", "ffn_up_exps.weight": "up_proj",
                   "ffn_down_exps.weight": "down_proj"}
# transformers keeps ERNIE's score correction as [1, experts]; an older converter squeezed it to [experts]
HF_SHAPES = {"exp_probs_b.bias": (1, -1)}
ROTARY_TENSORS = {"attn_q.weight": "num_attention_heads", "attn_k.weight": "num_key_value_heads"}

ATTENTION = ("attn_norm.weight", "attn_q.weight", "attn_k.weight", "attn_v.weight", "attn_output.weight",
             "ffn_norm.weight")
QKV_BIAS = ("attn_q.bias", "attn_k.bias", "attn_v.bias")
QK_NORM = ("attn_q_norm.weight", "attn_k_norm.weight")
DENSE_MLP = ("ffn_gate.weight", "ffn_up.weight", "ffn_down.weight")
ROUTED_EXPERTS = ("ffn_gate_inp.weight", *STACKED_EXPERTS)
SHARED_EXPERTS = ("ffn_gate_shexp.weight", "ffn_up_shexp.weight", "ffn_down_shexp.weight")
SCORE_CORRECTION = ("exp_probs_b.bias",)

REQUIRED = object()  # a metadata key without a default


class GgufFamily(NamedTuple):
    model_type: str
    # llama.cpp's converter permutes q/k rows for LLaMA only (HF rotates halves, llama.cpp's LLaMA RoPE pairs);
    # Qwen runs NEOX RoPE (halves, as HF does) and ERNIE's HF weights pair already, so theirs are as in HF
    permuted_qk: bool = False
    attention: Tuple[str, ...] = ATTENTION  # per-layer tensors besides the MLP
    config: Tuple[Tuple[str, Any], ...] = ()  # config.json keys with the one value the architecture has
    moe_keys: Tuple[Tuple[str, str, Any], ...] = ()  # (config key, metadata key after "<arch>.", default)


QWEN3_MOE_KEYS = (("num_experts", "expert_count", REQUIRED), ("num_experts_per_tok", "expert_used_count", REQUIRED),
                  ("moe_intermediate_size", "expert_feed_forward_length", REQUIRED),
                  ("norm_topk_prob", "expert_weights_norm", True))  # llama.cpp's qwen3moe always normalizes
ERNIE_MOE_KEYS = (("moe_num_experts", "expert_count", REQUIRED), ("moe_k", "expert_used_count", REQUIRED),
                  ("moe_intermediate_size", "expert_feed_forward_length", REQUIRED),
                  ("moe_num_shared_experts", "expert_shared_count", 0),
                  ("moe_layer_start_index", "leading_dense_block_count", 0),
                  ("moe_layer_interval", "interleave_moe_layer_step", 1))

FAMILY_ROWS = {
    "llama": GgufFamily("llama", permuted_qk=True, config=(("attention_bias", False), ("mlp_bias", False))),
    "qwen2": GgufFamily("qwen2", attention=ATTENTION + QKV_BIAS),
    "qwen3": GgufFamily("qwen3", attention=ATTENTION + QK_NORM, config=(("attention_bias", False),)),
    "qwen3moe": GgufFamily("qwen3_moe", attention=ATTENTION + QK_NORM, config=(("attention_bias", False),),
                           moe_keys=QWEN3_MOE_KEYS),
    "ernie4_5": GgufFamily("ernie4_5", config=(("use_bias", False),)),
    "ernie4_5-moe": GgufFamily("ernie4_5_moe", config=(("use_bias", False),), moe_keys=ERNIE_MOE_KEYS),
}
# only the architectures the installed gguf package knows (an older one has no ERNIE 4.5)
GGUF_FAMILIES = {arch: row for arch, row in FAMILY_ROWS.items() if arch in gguf.MODEL_ARCH_NAMES.values()}


def qwen3_moe_sparse_layer_keys(sparse: Iterable[int], layers: int) -> Dict[str, Any]:
    # no metadata says which layers are sparse (llama.cpp makes all of them so): those holding experts are
    return {"decoder_sparse_step": 1, "mlp_only_layers": sorted(set(range(layers)) - set(sparse))}


def ernie_moe_sparse_layer_keys(sparse: Iterable[int], layers: int) -> Dict[str, Any]:
    # the start and the interval come from the metadata; the converter writes no end: the last layer
    return {"moe_layer_end_index": layers - 1}


SPARSE_LAYER_KEYS = {"qwen3_moe": qwen3_moe_sparse_layer_keys, "ernie4_5_moe": ernie_moe_sparse_layer_keys}


def layer_of(gguf_name: str) -> Tuple[int, str]:
    """blk.3.attn_q.weight -> (3, "attn_q.weight"); (-1, name) for a tensor outside the layers."""
    parts = gguf_name.split(".", 2)
    if len(parts) == 3 and parts[0] == "blk" and parts[1].isdigit():
        return int(parts[1]), parts[2]
    return -1, gguf_name


def expected_tensors(family: GgufFamily, layers: int, moe) -> Dict[str, bool]:
    """{GGUF tensor name: required} in layer order for this config (`moe`: its MoeSettings or None)."""
    names = {"token_embd.weight": True, "output_norm.weight": True, "output.weight": False}
    for index in range(layers):
        mlp = DENSE_MLP
        if moe is not None and index in moe.sparse_layers:
            mlp = ROUTED_EXPERTS + (SHARED_EXPERTS if moe.shared_size else ()) + (
                SCORE_CORRECTION if moe.score_correction else ())
        names.update({f"blk.{index}.{name}": True for name in family.attention + mlp})
    return names


def moe_config(meta: dict, family: GgufFamily, tensor_names: Iterable[str], layers: int) -> Tuple[dict, Optional[str]]:
    """The family's MoE config.json keys from the metadata and the layers holding experts; or a problem."""
    arch = meta["general.architecture"]
    values = {}
    for key, name, default in family.moe_keys:
        values[key] = meta.get(f"{arch}.{name}", default)
        if values[key] is REQUIRED:
            return {}, f"required metadata key {arch}.{name} is missing"
    sparse = {layer for layer, name in map(layer_of, tensor_names) if name in ROUTED_EXPERTS}
    return {**values, **SPARSE_LAYER_KEYS[family.model_type](sparse, layers)}, None


def tensor_name_problem(tensor_names: List[str], config: dict, family: GgufFamily) -> Optional[str]:
    """A tensor the config's model needs and the file lacks, or one it has no place for; None: all fit."""
    layers = config["num_hidden_layers"]
    try:
        moe = moe_settings(FAMILIES[family.model_type].moe, config, layers)
    except ValueError as err:
        return f"{err} (in the config.json made from the GGUF metadata)"
    expected = expected_tensors(family, layers, moe)
    present = set(tensor_names)
    missing = [name for name, required in expected.items() if required and name not in present]
    if missing:
        layer, _ = layer_of(missing[0])
        role = "" if moe is None or layer < 0 else (
            f" (layer {layer} is a mixture-of-experts layer)" if layer in moe.sparse_layers else
            f" (layer {layer} is a dense layer)")
        return f"tensor {missing[0]} is missing{role}"
    unplaced = [name for name in tensor_names if name not in expected]
    if unplaced:
        return f"tensor {unplaced[0]} has no place in a Hugging Face {family.model_type} model of this config"
    return None


def unpermute_rotary(weight: np.ndarray, n_head: int) -> np.ndarray:
    """Inverse of convert_hf_to_gguf.py's LlamaModel.permute.

    llama.cpp's rope rotates adjacent pairs (x0, x1), HF's rotate_half rotates (x_i, x_{i+d/2}); the converter
    interleaves each head's two halves of q/k rows to switch layouts, so we de-interleave them here.
    """
    rows = weight.shape[0]
    return weight.reshape(n_head, rows // n_head // 2, 2, *weight.shape[1:]).swapaxes(1, 2).reshape(weight.shape)


def hf_tensors(gguf_name: str, weight: np.ndarray, config: dict, family: GgufFamily) -> Dict[str, np.ndarray]:
    """One GGUF tensor (a name tensor_name_problem accepted) as the HF tensor(s) it holds."""
    layer, name = layer_of(gguf_name)
    if layer < 0:
        return {GLOBAL_TENSORS[name]: weight}
    prefix = f"model.layers.{layer}."
    if name in STACKED_EXPERTS:  # slices of a C-contiguous stack along its first axis are contiguous
        return {f"{prefix}mlp.experts.{expert}.{STACKED_EXPERTS[name]}.weight": per_expert
                for expert, per_expert in enumerate(weight)}
    if family.permuted_qk and name in ROTARY_TENSORS:
        weight = np.ascontiguousarray(unpermute_rotary(weight, config[ROTARY_TENSORS[name]]))
    return {prefix + LAYER_TENSORS[name]: weight.reshape(HF_SHAPES.get(name, weight.shape))}
