"""Convert a PaddleNLP-written LLaMA / Qwen2 checkpoint into this project's Hugging Face layout.

    python tools/convert_checkpoint.py --input paddlenlp_model_dir --output checkpoints/converted
        [--dtype float32|bfloat16|float16] [--max_shard_mb 2048]

The input is what PaddleNLP's `save_pretrained` wrote: config.json plus `model_state.pdparams`, its shards and
`model_state.pdparams.index.json`, or `model.safetensors` (+ index) under PaddleNLP's tensor names and [in, out]
Linear layout (fused `qkv_proj` / `gate_up_fused_proj` are split). The output has transformers' names, [out, in]
layout, safetensors weights and a config.json with PaddleNLP's run-time switches dropped; it is written atomically.
Converting is optional: `from_pretrained` (and so `model_name_or_path`) reads the PaddleNLP directory directly.
Tokenizer files in our formats (tokenizer.json, tokenizer_config.json, ...) are copied along.
"""
from __future__ import annotations

from alignment.tool_parser import ToolParser
from alignment.cpu_env import apply_cpu_defaults

apply_cpu_defaults()  # this CPU's thread and MKL settings, before paddle is imported


def main(argv=None) -> str:
    p = ToolParser(__doc__)
    p.add_argument("--input", required=True, help="checkpoint directory written by PaddleNLP (or an HF one)")
    p.add_argument("--output", required=True, help="where to write the HF-layout checkpoint")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"],
                   help="dtype of the written weights (default float32)")
    p.add_argument("--max_shard_mb", type=int, default=2048, help="largest safetensors shard, in MiB")
    p.add_argument("--overwrite", action="store_true", help="replace what is at --output already")
    args = p.parse_args(argv)
    from alignment.fileio import refuse_to_replace
    from alignment.models.convert.from_paddlenlp import convert
    from alignment.training.setup import user_errors

    with user_errors():  # a bad checkpoint or argument: one line naming it, exit 2
        refuse_to_replace(args.output, args.overwrite)
        path = convert(args.input, args.output, args.dtype, args.max_shard_mb)
    print(f"converted {args.input} into {path}")
    return path

