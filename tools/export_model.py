"""Export a trained policy for inference: an HF-layout checkpoint and a static program with a KV cache.

    python tools/export_model.py --model outputs/smollm2-ppo/policy --output exported/smollm2-ppo
        [--base DIR] [--no-progress]

--model is an HF-layout checkpoint or a LoRA adapter directory (merged onto --base, default the
adapter's base_model_name_or_path). Writes
    <output>/hf/         the merged checkpoint (config.json, model.safetensors, tokenizer files);
                         loads in transformers' AutoModelForCausalLM and in our from_pretrained
    <output>/inference/  model.json + model.pdiparams (paddle.jit.save of
                         static_decode.CachedForward), the tokenizer files and export.json
One program serves prefill and decoding: input_ids [b, s], attention_mask [b, t + s], position_ids
[b, s] and 2 x layers caches [b, kv_heads, t, d] -> the logits [b, vocab] at the last position and
the caches grown to t + s. Batch, width and cache length are dynamic: the prefill is the call with
t = 0 (left-padded prompts), each decode step a call with s = 1. Weights are stored once.
Then `python tools/predict.py --model <output> --prompts prompts.jsonl` generates with it.
"""
from __future__ import annotations

import contextlib
import os
import sys

if not __package__:  # run as a script from a checkout: make `alignment` importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from alignment.tool_parser import ToolParser  # noqa: E402

from alignment.cpu_env import apply_cpu_defaults  # noqa: E402

apply_cpu_defaults()  # this CPU's thread and MKL settings, before paddle is imported

import paddle  # noqa: E402

EXPORT_INFO = "export.json"
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
    from alignment.models import LlamaForCausalLM

    if os.path.exists(os.path.join(model_dir, "adapter_config.json")):
        import importlib

        # tools.merge_lora in a checkout, alignment.tools.merge_lora when installed
        importlib.import_module(f"{__package__ or 'tools'}.merge_lora").merge(model_dir, hf_dir, base)
    else:
        model = LlamaForCausalLM.from_pretrained(model_dir)  # validates config, weights and shapes
        model.save_pretrained(hf_dir, tokenizer_dir=model_dir)
    if not os.path.exists(os.path.join(hf_dir, "tokenizer.json")):
        raise FileNotFoundError(f"{model_dir}: no tokenizer.json to export with the model")


def weight_dtype(model) -> str:
    """"float32", "bfloat16", ...: the dtype of the weights, and so of the KV cache."""
    return str(model.model.embed_tokens.weight.dtype).replace("paddle.", "")


def save_program(model, folder: str) -> None:
    """paddle.jit.save of CachedForward with dynamic batch, width and cache length."""
    from alignment.models.static_decode import CachedForward, cached_forward_spec

    if model.config.tensor_parallel_degree > 1:
        raise ValueError("export needs the whole model (tensor_parallel_degree 1)")
    model.eval()
    static = paddle.jit.to_static(CachedForward(model), full_graph=True,
                                  input_spec=cached_forward_spec(model.config, weight_dtype(model)))
    paddle.jit.save(static, os.path.join(folder, PROGRAM))


def export_info(model, tokenizer, model_dir: str) -> dict:
    """What predict.py needs besides the program: the cache layout, the stop and pad tokens, the limits."""
    from alignment.models.static_decode import CACHED_FORWARD_INPUTS, EXPORT_FORMAT

    cfg = model.config
    return {"format": EXPORT_FORMAT, "program": PROGRAM, "source": os.path.abspath(model_dir),
            "inputs": list(CACHED_FORWARD_INPUTS) + [f"cache_{i}" for i in range(2 * cfg.num_hidden_layers)],
            "num_hidden_layers": cfg.num_hidden_layers, "num_key_value_heads": cfg.num_key_value_heads,
            "head_dim": cfg.head_dim, "dtype": weight_dtype(model),
            "vocab_size": cfg.vocab_size, "max_position_embeddings": cfg.max_position_embeddings,
            "eos_token_ids": cfg.eos_token_ids, "pad_token_id": tokenizer.pad_token_id}


def export(model_dir: str, output: str, base: str = None, quiet: bool = False) -> str:
    """Write <output>/hf and <output>/inference (see the module docstring); all or nothing."""
    from alignment.fileio import atomic_directory, write_json_atomic
    from alignment.models import LlamaForCausalLM, Tokenizer
    from alignment.models.tokenizer import copy_tokenizer_files

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
            with progress.stage(STAGES[2]):
                save_program(model, folder)
            with progress.stage(STAGES[3]):
                copy_tokenizer_files(hf_dir, folder)
                write_json_atomic(os.path.join(folder, EXPORT_INFO), export_info(model, tokenizer, model_dir))
    finally:
        progress.close()
    return output


def main(argv=None) -> str:
    p = ToolParser(__doc__)
    p.add_argument("--model", required=True, help="policy checkpoint (HF layout) or LoRA adapter directory")
    p.add_argument("--output", required=True)
    p.add_argument("--base", default=None, help="base checkpoint of a LoRA adapter")
    p.add_argument("--no-progress", action="store_true", help="no progress bar or stage lines")
    args = p.parse_args(argv)
    from alignment.training.setup import user_errors

    with user_errors():  # a bad checkpoint or argument: one line naming it, exit 2
        path = export(args.model, args.output, args.base, args.no_progress)
    print(f"exported {args.model} -> {path}/hf (HF layout) and {path}/inference (paddle.inference, KV cache)")
    return path


if __name__ == "__main__":
    main()
