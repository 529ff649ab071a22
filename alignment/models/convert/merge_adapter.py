"""LoRA adapters (PEFT layout) merged into their base model, written as a full Hugging Face-layout checkpoint that
loads like any other (from_pretrained here, transformers' AutoModelFor... there)."""
from __future__ import annotations

import os

from alignment.models.llama import LlamaForCausalLM
from alignment.models.lora import apply_lora, load_adapter, merge_lora, read_adapter_config
from alignment.models.score_model import ScoreModel


def merge(adapter: str, output: str, base: str = None, is_rm: bool = False) -> str:
    config = read_adapter_config(adapter)
    base = base or config.get("base_model_name_or_path")
    if not base:
        raise ValueError(f"{adapter}: adapter_config.json names no base_model_name_or_path; pass --base")
    if (config.get("task_type") == "SEQ_CLS") != is_rm:
        raise ValueError(f"{adapter}: task_type {config.get('task_type')!r} "
                         f"{'needs' if config.get('task_type') == 'SEQ_CLS' else 'does not take'} --is_rm")
    model = (ScoreModel if is_rm else LlamaForCausalLM).from_pretrained(base)
    apply_lora(model, config["r"], config["lora_alpha"], 0.0, config["target_modules"],
               trainable=[f"{m}." for m in config.get("modules_to_save") or []],
               rslora=bool(config.get("use_rslora", False)))
    load_adapter(model, adapter)
    if is_rm:
        model.load_extra_files(adapter)  # the score normaliser saved beside the adapter
    merge_lora(model)
    tokenizer_dir = adapter if os.path.exists(os.path.join(adapter, "tokenizer.json")) else base
    model.save_pretrained(output, tokenizer_dir=tokenizer_dir)
    return output
