"""A PaddleNLP-written LLaMA / Qwen2 (or PaddleFormers-written ERNIE 4.5) checkpoint rewritten in this project's
Hugging Face layout.

The input is what PaddleNLP's `save_pretrained` wrote: config.json plus `model_state.pdparams`, its shards and
`model_state.pdparams.index.json`, or `model.safetensors` (+ index) under PaddleNLP's tensor names and [in, out]
Linear layout (alignment/models/paddlenlp_checkpoint.py reads it). The output has transformers' names, [out, in]
layout, safetensors weights and a config.json with PaddleNLP's run-time switches dropped; it is written atomically.
"""
from __future__ import annotations

import os

from alignment.models.llama import LlamaForCausalLM


def convert(input_dir: str, output_dir: str, dtype: str = "float32", max_shard_mb: int = 2048) -> str:
    """Load `input_dir` strictly (every tensor present, every shape checked) and save it in our layout."""
    if os.path.abspath(input_dir) == os.path.abspath(output_dir):
        raise ValueError(f"{output_dir}: the output must be a new directory, not the input")
    model = LlamaForCausalLM.from_pretrained(input_dir, dtype=dtype)
    model.save_pretrained(output_dir, tokenizer_dir=input_dir, max_shard_bytes=max_shard_mb * 1024**2)
    return output_dir
