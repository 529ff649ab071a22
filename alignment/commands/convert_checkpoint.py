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

from alignment.commands import add_output, write_output
from alignment.commands.tool_parser import ToolParser, positive_int


def main(argv=None) -> str:
    p = ToolParser(__doc__)
    p.add_argument("--input", required=True, help="checkpoint directory written by PaddleNLP (or an HF one)")
    add_output(p, "where to write the HF-layout checkpoint")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"],
                   help="dtype of the written weights (default float32)")
    p.add_argument("--max_shard_mb", type=positive_int, default=2048, help="largest safetensors shard, in MiB")
    args = p.parse_args(argv)
    from alignment.models.convert.from_paddlenlp import convert

    return write_output(args, lambda: convert(args.input, args.output, args.dtype, args.max_shard_mb),
                        lambda path: f"converted {args.input} into {path}")

