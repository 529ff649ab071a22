"""Merge LoRA adapters (PEFT layout) into their base model and write a full Hugging Face-layout checkpoint.

    python tools/merge_lora.py --adapter outputs/tiny-sft-lora/model --output outputs/tiny-sft-merged
        [--base checkpoints/tiny] [--is_rm]

--base defaults to the adapter's `base_model_name_or_path`. --is_rm loads the base as a score model (reward model
or critic) and restores the trained score head saved with the adapter. The result loads like any checkpoint
(from_pretrained here, transformers' AutoModelFor... there).
"""
from __future__ import annotations

from alignment.commands import add_output, write_output
from alignment.commands.tool_parser import ToolParser


def main(argv=None) -> str:
    p = ToolParser(__doc__)
    p.add_argument("--adapter", required=True, help="directory with adapter_config.json + adapter_model.safetensors")
    add_output(p, "where to write the merged checkpoint")
    p.add_argument("--base", default=None, help="base checkpoint (default: the adapter's base_model_name_or_path)")
    p.add_argument("--is_rm", action="store_true", help="the adapter belongs to a score model (reward / critic)")
    args = p.parse_args(argv)
    from alignment.models.convert.merge_adapter import merge

    return write_output(args, lambda: merge(args.adapter, args.output, args.base, args.is_rm),
                        lambda path: f"merged {args.adapter} into {path}")

