"""Export a trained policy for inference: an HF-layout checkpoint and a static program with a KV cache.

    <output>/hf/         the merged checkpoint (config.json, model.safetensors, tokenizer files);
                         loads in transformers' AutoModelForCausalLM and in our from_pretrained
    <output>/inference/  model.json + model.pdiparams (paddle.jit.save of static_decode.CachedForward),
                         the tokenizer files and export.json

One program serves prefill and decoding: input_ids [b, s], attention_mask [b, t + s], position_ids [b, s] and
2 x layers caches [b, kv_heads, t, d] -> the logits [b, vocab] at the last position and the caches grown to t + s.
Batch, width and cache length are dynamic: the prefill is the call with t = 0 (left-padded prompts), each decode step
a call with s = 1. Weights are stored once. exported_model.load reads it back.
"""
from __future__ import annotations

import contextlib
import os
import sys

import paddle

from alignment.fileio import atomic_directory, write_json_atomic
from alignment.inference.exported_model import EXPORT_INFO, weight_dtype
from alignment.models import LlamaForCausalLM, Tokenizer
from alignment.models.convert.merge_adapter import merge
from alignment.models.static_decode import CACHED_FORWARD_INPUTS, EXPORT_FORMAT, CachedForward, cached_forward_spec
from alignment.models.tokenizer import copy_tokenizer_files

PROGRAM = "model"  # <output>/inference/model.json + model.pdiparams
STAGES = ("saving the HF checkpoint", "loading it", "tracing the KV-cache program", "writing inference/")


class Progress:
    """Export stages: a tqdm bar on a terminal, one "export: <stage>" line on stderr otherwise; nothing if quiet."""

    def __init__(self, quiet: bool = False):
        from tqdm import tqdm

        self.quiet = quiet
        self.bar = tqdm(total=len(STAGES), desc="export", unit="stage", file=sys.stderr,
                        disable=True if quiet else None)  # None: off when stderr is not a terminal

    @contextlib.contextmanager
    def stage(self, name: str):
        if self.bar.disable and not self.quiet:
            print(f"export: {name}", file=sys.stderr, flush=True)
        self.bar.set_postfix_str(name)
        yield
        self.bar.update(1)

    def close(self):
        self.bar.close()


def save_hf(model_dir: str, hf_dir: str, base: str = None) -> None:
    """The checkpoint (a LoRA adapter merged onto its base) in HF layout, with its tokenizer."""
    if os.path.exists(os.path.join(model_dir, "adapter_config.json")):
        merge(model_dir, hf_dir, base)
    else:
        model = LlamaForCausalLM.from_pretrained(model_dir)  # validates config, weights and shapes
        model.save_pretrained(hf_dir, tokenizer_dir=model_dir)
    if not os.path.exists(os.path.join(hf_dir, "tokenizer.json")):
        raise FileNotFoundError(f"{model_dir}: no tokenizer.json to export with the model")


def save_program(model, folder: str) -> None:
    """paddle.jit.save of CachedForward with dynamic batch, width and cache length."""
    if model.config.tensor_parallel_degree > 1:
        raise ValueError("export needs the whole model (tensor_parallel_degree 1)")
    model.eval()
    static = paddle.jit.to_static(CachedForward(model), full_graph=True,
                                  input_spec=cached_forward_spec(model.config, weight_dtype(model)))
    paddle.jit.save(static, os.path.join(folder, PROGRAM))


def export_info(model, tokenizer, model_dir: str) -> dict:
    """What exported_model.load needs besides the program: the cache layout, the stop and pad tokens, the limits."""
    cfg = model.config
    return {"format": EXPORT_FORMAT, "program": PROGRAM, "source": os.path.abspath(model_dir),
            "inputs": list(CACHED_FORWARD_INPUTS) + [f"cache_{i}" for i in range(2 * cfg.num_hidden_layers)],
            "num_hidden_layers": cfg.num_hidden_layers, "num_key_value_heads": cfg.num_key_value_heads,
            "head_dim": cfg.head_dim, "dtype": weight_dtype(model),
            "vocab_size": cfg.vocab_size, "max_position_embeddings": cfg.max_position_embeddings,
            "eos_token_ids": cfg.eos_token_ids, "pad_token_id": tokenizer.pad_token_id}


def export(model_dir: str, output: str, base: str = None, quiet: bool = False, dtype: str = None) -> str:
    """Write <output>/hf and <output>/inference (see the module docstring); all or nothing. dtype, if given, must be
    the weights' (PaddleNLP's --dtype; they are not converted)."""
    if not os.path.isdir(model_dir):
        raise FileNotFoundError(f"{model_dir}: model directory not found")
    progress = Progress(quiet)
    try:
        with atomic_directory(output) as tmp:
            hf_dir, folder = os.path.join(tmp, "hf"), os.path.join(tmp, "inference")
            with progress.stage(STAGES[0]):
                save_hf(model_dir, hf_dir, base)
            with progress.stage(STAGES[1]):
                model, tokenizer = LlamaForCausalLM.from_pretrained(hf_dir), Tokenizer.from_pretrained(hf_dir)
                if dtype is not None and dtype != weight_dtype(model):
                    raise ValueError(f"--dtype {dtype}: {model_dir} is {weight_dtype(model)} (converting weights is "
                                     f"not built; pass --dtype {weight_dtype(model)} or leave it out)")
            with progress.stage(STAGES[2]):
                save_program(model, folder)
            with progress.stage(STAGES[3]):
                copy_tokenizer_files(hf_dir, folder)
                write_json_atomic(os.path.join(folder, EXPORT_INFO), export_info(model, tokenizer, model_dir))
    finally:
        progress.close()
    return output
