"""The keys of a Hugging Face LLaMA-family config.json that size a model, and what each must be: one schema for
building the model (models/config.py), planning its memory (planning/memory.py) and importing one (a GGUF file's
metadata, models/convert/from_gguf.py), so all three refuse the same configs, naming the key. No silent defaults
(a missing size is not 7B's), no coercion (a boolean is not a size, "false" is not false)."""
from __future__ import annotations

from typing import Dict, List, Optional

from alignment.inputs import FLAG, POSITIVE_NUMBER, TEXT, either, integer, key_problems, list_of

MAX_SIZE = 2 ** 31 - 1  # no dimension of a real model comes near; beyond it sizes only overflow
SIZE = integer(1, MAX_SIZE, "a positive integer (at most 2^31 - 1)")
TOKEN_ID = integer(-1, MAX_SIZE, "a token id (an integer, -1 for none)")  # not checked against vocab_size: shrunk
# test models keep their tokenizer's ids
REQUIRED_KEYS = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads")
KINDS = {**{key: SIZE for key in REQUIRED_KEYS + ("num_key_value_heads", "head_dim", "max_position_embeddings")},
         "rms_norm_eps": POSITIVE_NUMBER, "rope_theta": POSITIVE_NUMBER, "initializer_range": POSITIVE_NUMBER,
         "tie_word_embeddings": FLAG, "attention_bias": FLAG, "mlp_bias": FLAG, "model_type": TEXT,
         "hidden_act": TEXT, "bos_token_id": TOKEN_ID, "pad_token_id": TOKEN_ID,
         "eos_token_id": either(TOKEN_ID, list_of(TOKEN_ID, True, "a non-empty list of them"))}


def model_config_problems(data: dict, names: Optional[Dict[str, str]] = None) -> List[str]:
    """What makes a config.json (as a dict of transformers' keys) unusable: missing sizes, values of the wrong type
    or range, sizes that do not fit together. `names` spells keys as the file does (a GGUF file's keys)."""
    names = names or {}
    problems = key_problems(data, KINDS, REQUIRED_KEYS, names)
    if problems:
        return problems
    hidden, heads = data["hidden_size"], data["num_attention_heads"]
    kv_heads = data.get("num_key_value_heads") or heads
    if heads % kv_heads:
        problems.append(f"key {names.get('num_attention_heads', 'num_attention_heads')!r} {heads} is not a multiple "
                        f"of num_key_value_heads {kv_heads}")
    if data.get("head_dim") is None and hidden % heads:
        problems.append(f"key {names.get('hidden_size', 'hidden_size')!r} {hidden} is not divisible by "
                        f"num_attention_heads {heads} (and no head_dim is given)")
    return problems
