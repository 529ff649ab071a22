"""The mixture-of-experts keys of a config.json, per family (`Family.moe` in model_families.py): which layers are
sparse, how many experts, how tokens are routed, read into one MoeSettings. Paddle-free, like the family table.
The keys stay in the config's `extra` and are written back as the file spelled them."""
from __future__ import annotations

from typing import Dict, List, NamedTuple, Optional, Tuple

from alignment.inputs import FLAG, integer, key_problems, list_of, number

SIZE = integer(1, description="a positive integer")
LAYERS = list_of(integer(0), description="a list of layer indices (integers >= 0)")
LAYER_OR_LAST = integer(-1, description="a layer index (-1: the last)")
RATE = number(at_least=0, description="a number >= 0")


class MoeSettings(NamedTuple):
    num_experts: int
    top_k: int
    expert_size: int  # each expert's intermediate size
    shared_size: int  # intermediate size of the shared experts (one SwiGLU over all of them); 0: none
    sparse_layers: Tuple[int, ...]  # the decoder layers whose MLP is the expert block
    normalize_top_k: bool  # the top-k weights divided by their sum
    norm_min: float  # ... clamped below at this (ERNIE's moe_norm_min; 0: plain division)
    score_correction: bool  # a per-expert bias added to the probabilities for the choice only (ERNIE)
    aux_loss_coef: float  # router_aux_loss_coef: weight of the load-balancing loss in training
    output_router_logits: bool  # transformers' switch for computing that loss in its forward


def _qwen3_moe(data: dict, layers: int) -> Tuple[Dict[str, int], List[str], MoeSettings]:
    keys = {"num_experts": SIZE, "num_local_experts": SIZE, "num_experts_per_tok": SIZE,
            "moe_intermediate_size": SIZE, "norm_topk_prob": FLAG, "decoder_sparse_step": SIZE,
            "mlp_only_layers": LAYERS, "router_aux_loss_coef": RATE, "output_router_logits": FLAG}
    required = ["num_experts_per_tok", "moe_intermediate_size"]
    if "num_local_experts" not in data:  # transformers 5 writes num_local_experts, the Qwen checkpoints num_experts
        required.append("num_experts")
    problems = key_problems(data, keys, required)
    if problems:
        return {}, problems, None
    experts = data.get("num_experts", data.get("num_local_experts"))
    dense = set(data.get("mlp_only_layers") or [])
    step = data.get("decoder_sparse_step", 1)
    sparse = tuple(i for i in range(layers) if i not in dense and (i + 1) % step == 0)
    return {"num_experts_per_tok": data["num_experts_per_tok"]}, [], MoeSettings(
        experts, data["num_experts_per_tok"], data["moe_intermediate_size"], 0, sparse,
        data.get("norm_topk_prob", False), 0.0, False, data.get("router_aux_loss_coef", 0.001),
        data.get("output_router_logits", False))


def _ernie4_5_moe(data: dict, layers: int) -> Tuple[Dict[str, int], List[str], MoeSettings]:
    keys = {"moe_num_experts": SIZE, "moe_k": SIZE, "moe_intermediate_size": SIZE,
            "moe_num_shared_experts": integer(0, description="an integer >= 0"), "moe_layer_start_index": integer(0, description="a layer index"),
            "moe_layer_end_index": LAYER_OR_LAST, "moe_layer_interval": SIZE, "moe_norm_min": RATE,
            "router_aux_loss_coef": RATE, "output_router_logits": FLAG}
    problems = key_problems(data, keys, ["moe_num_experts", "moe_k", "moe_intermediate_size"])
    if data.get("num_nextn_predict_layers"):
        problems.append(f"key 'num_nextn_predict_layers' {data['num_nextn_predict_layers']} is not supported for "
                        "model_type 'ernie4_5_moe' (multi-token prediction layers; only 0 or null)")
    if problems:
        return {}, problems, None
    start, interval = data.get("moe_layer_start_index", 1), data.get("moe_layer_interval", 1)
    end = data.get("moe_layer_end_index", -1)
    end = layers - 1 if end == -1 else end
    sparse = tuple(i for i in range(layers) if (i + 1) % interval == 0 and start <= i <= end)
    return {"moe_k": data["moe_k"]}, [], MoeSettings(
        data["moe_num_experts"], data["moe_k"], data["moe_intermediate_size"],
        data["moe_intermediate_size"] * data.get("moe_num_shared_experts", 2), sparse, True,
        data.get("moe_norm_min", 1e-12), True, data.get("router_aux_loss_coef", 0.001),
        data.get("output_router_logits", False))


MOE_READERS = {"qwen3_moe": _qwen3_moe, "ernie4_5_moe": _ernie4_5_moe}


def moe_settings(kind: Optional[str], data: dict, layers: int) -> Optional[MoeSettings]:
    """The MoE settings of a config (its keys as transformers writes them) for the family's MoE kind (None: a dense
    family). A wrong key is a ValueError naming it."""
    if kind is None:
        return None
    top_k, problems, settings = MOE_READERS[kind](data, layers)
    if problems:
        raise ValueError("; ".join(problems))
    for key, value in top_k.items():
        if value > settings.num_experts:
            raise ValueError(f"key {key!r} {value} is more than the {settings.num_experts} experts")
    return settings
