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

import os
import sys

if not __package__:  # run as a script from a checkout: make `alignment` importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from alignment.tool_parser import ToolParser  # noqa: E402
from alignment.cpu_env import apply_cpu_defaults  # noqa: E402

apply_cpu_defaults()  # this CPU's thread and MKL settings, before paddle is imported


def convert(input_dir: str, output_dir: str, dtype: str = "float32", max_shard_mb: int = 2048) -> str:
    """Load `input_dir` strictly (every tensor present, every shape checked) and save it in our layout."""
    from alignment.models import LlamaForCausalLM

    if os.path.abspath(input_dir) == os.path.abspath(output_dir):
        raise ValueError(f"{output_dir}: the output must be a new directory, not the input")
    model = LlamaForCausalLM.from_pretrained(input_dir, dtype=dtype)
    model.save_pretrained(output_dir, tokenizer_dir=input_dir, max_shard_bytes=max_shard_mb * 1024**2)
    return output_dir


def main(argv=None) -> str:
    p = ToolParser(__doc__)
    p.add_argument("--input", required=True, help="checkpoint directory written by PaddleNLP (or an HF one)")
    p.add_argument("--output", required=True, help="where to write the HF-layout checkpoint")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"],
                   help="dtype of the written weights (default float32)")
    p.add_argument("--max_shard_mb", type=int, default=2048, help="largest safetensors shard, in MiB")
    args = p.parse_args(argv)
    from alignment.training.setup import user_errors

    with user_errors():  # a bad checkpoint or argument: one line naming it, exit 2
        path = convert(args.input, args.output, args.dtype, args.max_shard_mb)
    print(f"converted {args.input} into {path}")
    return path


if __name__ == "__main__":
    main()
