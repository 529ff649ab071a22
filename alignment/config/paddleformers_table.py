"""PaddleFormers' names for PaddleNLP's keys (its Megatron-style renames, its data keys) and the keys of its DPO /
SFT YAML files (PaddlePaddle/PaddleFormers examples/config/dpo/full.yaml, paddleformers/trainer/training_args.py),
as `Rule`s of the same three kinds as alignment/config/paddlenlp_table.py; alignment/config/paddlenlp.py merges
them into its table. Plain Python (bottom layer)."""
from __future__ import annotations

from typing import Callable, Dict

from alignment.config.paddlenlp_table import ALIAS, COMM, NOTICE, REFUSE, Rule, _fused
from alignment.config.paddlenlp_values import as_flag, as_number, asks_nothing, get_set, one_of

# PaddleFormers' dataset types whose rows this toolkit reads by their keys (alignment/data/detect.py): erniekit is
# PaddleNLP's src / tgt (/ response / sort) layout; messages are chat messages
DATASET_TYPES = ("erniekit", "messages")
MIX_STRATEGIES = ("concat",)


def _equal_probabilities(value, values) -> bool:
    """Mixing probabilities that weigh every file alike: the files are simply concatenated, as here."""
    parts = [as_number(part) for part in str(value).replace(",", " ").split()] if not asks_nothing(value) else []
    return not parts or (None not in parts and len(set(parts)) == 1)


def _fine_tuning(ctx, key, value):
    """fine_tuning: full | lora -> our `lora` flag (PaddleFormers chooses LoRA by this key)."""
    name = str(value).strip().lower()
    if name not in ("full", "lora"):
        return ctx.problem(key, f"must be 'full' or 'lora', got {value!r}")
    ctx.alias(key, "lora", name == "lora")


SPECIAL: Dict[str, Callable] = {"fine_tuning": _fine_tuning}

PROBABILITIES = ("files are concatenated here; weigh them with proportions in train_datasets / eval_datasets "
                 "specs ('auto:2.0:a.jsonl' repeats a file twice) instead of sampling probabilities")
TEMPLATE = ("prompts use the tokenizer's own chat template here (its tokenizer_config.json), or none with "
            "chat_template: none; PaddleFormers' named templates are not built")

TABLE: Dict[str, Rule] = {
    # ---- Megatron-style renames (honoured) ----
    "tensor_model_parallel_size": Rule(ALIAS, "tensor_parallel_degree", "PaddleFormers' name"),
    "pipeline_model_parallel_size": Rule(ALIAS, "pipeline_parallel_degree", "PaddleFormers' name"),
    "sharding_parallel_size": Rule(ALIAS, "sharding_parallel_degree", "PaddleFormers' name"),
    "eval_dataset_path": Rule(ALIAS, "eval_datasets", "PaddleFormers' name of dev_dataset_path"),
    "fine_tuning": Rule(ALIAS, "lora", "'full': lora false; 'lora': lora true"),
    # ---- data ----
    **dict.fromkeys(("train_dataset_type", "eval_dataset_type"), Rule(
        REFUSE, None, f"this toolkit reads a file in the format its keys show (types {list(DATASET_TYPES)}); "
                      "name another format in the spec ('paddlenlp-preference:1.0:<path>')",
        inert=one_of(*DATASET_TYPES))),
    **dict.fromkeys(("train_dataset_prob", "eval_dataset_prob"),
                    Rule(REFUSE, None, PROBABILITIES, inert=_equal_probabilities)),
    "mix_strategy": Rule(REFUSE, None, PROBABILITIES, inert=one_of(*MIX_STRATEGIES)),
    "packing": Rule(NOTICE, None, "micro-batches are padded here (no packing of several samples into one row); the "
                                  "loss is the same"),
    "template": Rule(NOTICE, None, TEMPLATE),
    "template_backend": Rule(NOTICE, None, TEMPLATE, inert=lambda value, values: True),
    # ---- memory and kernels ----
    **dict.fromkeys(("recompute_method", "recompute_num_layers"), Rule(
        NOTICE, None, "this toolkit recomputes every decoder layer when recompute is true; only memory differs",
        inert=lambda value, values: not as_flag(get_set(values, "recompute", False)))),
    "_attn_implementation": Rule(NOTICE, None, _fused("attention (flashmask / flash attention)"),
                                 inert=one_of("eager", "sdpa")),
    "moe_token_dispatcher_type": Rule(NOTICE, None, "tokens are dispatched all-to-all here (expert_parallel_degree)"),
    "moe_router_bias_update_rate": Rule(NOTICE, None, "the score-correction bias is not updated in training here"),
    "overlap_p2p_comm": Rule(NOTICE, None, COMM),
    "batch_p2p_comm": Rule(NOTICE, None, COMM, inert=lambda value, values: True),
    # ---- checkpoints ----
    **dict.fromkeys(("save_checkpoint_format", "load_checkpoint_format"), Rule(
        NOTICE, None, "this toolkit reads and writes its own checkpoint layout (final models as HF safetensors; "
                      "step checkpoints reshard to any layout)")),
    "save_safetensors": Rule(NOTICE, None, "models are always saved as safetensors here",
                             inert=lambda value, values: as_flag(value) is not False),
}
