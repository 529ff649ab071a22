"""Export a trained policy for inference: a full HF-layout checkpoint and a Paddle static inference model.

    python tools/export_model.py --model outputs/smollm2-ppo/policy --output exported/smollm2-ppo
        [--base DIR] [--max-length 256] [--batch-size 1]

--model is an HF-layout checkpoint or a LoRA adapter directory (merged onto --base, default the adapter's
base_model_name_or_path). Writes
    <output>/hf/          the merged checkpoint (config.json, model.safetensors, tokenizer files): loads in
                          transformers' AutoModelForCausalLM and in our from_pretrained
    <output>/inference/   model.json + model.pdiparams (paddle.jit.save) and export.json; the static graph takes
                          input_ids [batch, max_length] (right-padded) and last_index [batch] and returns the
                          float32 logits [batch, vocab] at last_index. Fixed shapes: the graph has no Python-side
                          shape logic to trace, and causal attention makes the padding after last_index irrelevant.
Then `python tools/predict.py --model <output> --prompt "..."` generates with paddle.inference.
"""
from __future__ import annotations

import argparse
import os
import shutil
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from alignment.cpu_env import apply_cpu_defaults  # noqa: E402

apply_cpu_defaults()  # this CPU's thread and MKL settings, before paddle is imported

import paddle  # noqa: E402
import paddle.nn as nn  # noqa: E402

EXPORT_INFO = "export.json"


class LogitsAtIndex(nn.Layer):
    """input_ids [b, L], last_index [b] -> float32 logits [b, vocab] at each row's last real token."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, input_ids, last_index):
        hidden, _ = self.model.model(input_ids, paddle.ones_like(input_ids))  # [b, L, h]
        picked = paddle.take_along_axis(hidden, last_index.reshape([-1, 1, 1]), axis=1)  # [b, 1, h]
        return self.model.compute_logits(picked).squeeze(1)  # [b, vocab]


def export(model_dir: str, output: str, base: str = None, max_length: int = 256, batch_size: int = 1) -> str:
    from alignment.fileio import atomic_directory, write_json_atomic
    from alignment.models import LlamaForCausalLM

    if not os.path.isdir(model_dir):
        raise FileNotFoundError(f"{model_dir}: model directory not found")
    with atomic_directory(output) as tmp:
        hf_dir = os.path.join(tmp, "hf")
        if os.path.exists(os.path.join(model_dir, "adapter_config.json")):
            from tools.merge_lora import merge

            merge(model_dir, hf_dir, base)
        else:
            model = LlamaForCausalLM.from_pretrained(model_dir)  # validates config, weights and shapes
            model.save_pretrained(hf_dir, tokenizer_dir=model_dir)
        if not os.path.exists(os.path.join(hf_dir, "tokenizer.json")):
            raise FileNotFoundError(f"{model_dir}: no tokenizer.json to export with the model")
        model = LlamaForCausalLM.from_pretrained(hf_dir)
        if max_length > model.config.max_position_embeddings:
            raise ValueError(f"--max-length {max_length} exceeds the model's max_position_embeddings "
                             f"{model.config.max_position_embeddings}")
        static = paddle.jit.to_static(
            LogitsAtIndex(model), full_graph=True,
            input_spec=[paddle.static.InputSpec([batch_size, max_length], "int64", "input_ids"),
                        paddle.static.InputSpec([batch_size], "int64", "last_index")])
        paddle.jit.save(static, os.path.join(tmp, "inference", "model"))
        write_json_atomic(os.path.join(tmp, "inference", EXPORT_INFO), {
            "max_length": max_length, "batch_size": batch_size, "source": os.path.abspath(model_dir),
            "eos_token_ids": model.config.eos_token_ids, "vocab_size": model.config.vocab_size})
        shutil.copy(os.path.join(hf_dir, "tokenizer.json"), os.path.join(tmp, "inference", "tokenizer.json"))
    return output


def main(argv=None) -> str:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True, help="policy checkpoint (HF layout) or LoRA adapter directory")
    p.add_argument("--output", required=True)
    p.add_argument("--base", default=None, help="base checkpoint of a LoRA adapter")
    p.add_argument("--max-length", type=int, default=256, help="fixed sequence width of the static graph")
    p.add_argument("--batch-size", type=int, default=1, help="fixed batch of the static graph")
    args = p.parse_args(argv)
    from alignment.training.setup import user_errors

    with user_errors():  # a bad checkpoint or argument: one line naming it, exit 2
        path = export(args.model, args.output, args.base, args.max_length, args.batch_size)
    print(f"exported {args.model} -> {path}/hf (HF layout) and {path}/inference (paddle.inference)")
    return path


if __name__ == "__main__":
    main()
