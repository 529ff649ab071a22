"""Merge LoRA adapters (PEFT layout) into their base model and write a full Hugging Face-layout checkpoint.

    python tools/merge_lora.py --adapter outputs/tiny-sft-lora/model --output outputs/tiny-sft-merged
        [--base checkpoints/tiny] [--is_rm]

--base defaults to the adapter's `base_model_name_or_path`. --is_rm loads the base as a score model (reward model
or critic) and restores the trained score head saved with the adapter. The result loads like any checkpoint
(from_pretrained here, transformers' AutoModelFor... there).
"""
from __future__ import annotations

import os
import sys

if not __package__:  # run as a script from a checkout: make `alignment` importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from alignment.tool_parser import ToolParser  # noqa: E402

from alignment.cpu_env import apply_cpu_defaults  # noqa: E402

apply_cpu_defaults()  # this CPU's thread and MKL settings, before paddle is imported


def merge(adapter: str, output: str, base: str = None, is_rm: bool = False) -> str:
    from alignment.models import LlamaForCausalLM
    from alignment.models.lora import apply_lora, load_adapter, merge_lora, read_adapter_config
    from alignment.models.score_model import ScoreModel

    config = read_adapter_config(adapter)
    base = base or config.get("base_model_name_or_path")
    if not base:
        raise ValueError(f"{adapter}: adapter_config.json names no base_model_name_or_path; pass --base")
    if (config.get("task_type") == "SEQ_CLS") != is_rm:
        raise ValueError(f"{adapter}: task_type {config.get('task_type')!r} "
                         f"{'needs' if config.get('task_type') == 'SEQ_CLS' else 'does not take'} --is_rm")
    model = (ScoreModel if is_rm else LlamaForCausalLM).from_pretrained(base)
    apply_lora(model, config["r"], config["lora_alpha"], 0.0, config["target_modules"],
               trainable=[f"{m}." for m in config.get("modules_to_save") or []])
    load_adapter(model, adapter)
    if is_rm:
        model.load_extra_files(adapter)  # the score normaliser saved beside the adapter
    merge_lora(model)
    tokenizer_dir = adapter if os.path.exists(os.path.join(adapter, "tokenizer.json")) else base
    model.save_pretrained(output, tokenizer_dir=tokenizer_dir)
    return output


def main(argv=None) -> str:
    p = ToolParser(__doc__)
    p.add_argument("--adapter", required=True, help="directory with adapter_config.json + adapter_model.safetensors")
    p.add_argument("--output", required=True, help="where to write the merged checkpoint")
    p.add_argument("--base", default=None, help="base checkpoint (default: the adapter's base_model_name_or_path)")
    p.add_argument("--is_rm", action="store_true", help="the adapter belongs to a score model (reward / critic)")
    args = p.parse_args(argv)
    from alignment.training.setup import user_errors

    with user_errors():  # a bad checkpoint or argument: one line naming it, exit 2
        path = merge(args.adapter, args.output, args.base, args.is_rm)
    print(f"merged {args.adapter} into {path}")
    return path


if __name__ == "__main__":
    main()
