"""Export a trained policy for inference: an HF-layout checkpoint and a static program with a KV cache.

    python tools/export_model.py --model outputs/smollm2-ppo/policy --output exported/smollm2-ppo
        [--base DIR] [--no-progress]
    python tools/export_model.py --model_name_or_path outputs/smollm2-ppo/policy
        --output_path exported/smollm2-ppo --dtype float32 [--inference_model 1 --block_attn 1]

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

PaddleNLP's export_model.py flags are accepted: --model_name_or_path (= --model), --output_path (= --output),
--dtype (must be the checkpoint's dtype: weights are not converted), and, with a notice that they change nothing
here, --inference_model, --block_attn, --src_length, --max_length and --batch_size.
"""
from __future__ import annotations

from alignment.commands import paddlenlp_flags as pdnlp
from alignment.commands import write_output
from alignment.commands.tool_parser import ToolParser

NO_OPS = {**pdnlp.NO_OPS, **pdnlp.EXPORT_NO_OPS}


def main(argv=None) -> str:
    p = ToolParser(__doc__)
    p.add_argument("--model", "--model-name-or-path", dest="model", required=True,
                   help="policy checkpoint (HF layout) or LoRA adapter directory")
    p.add_argument("--base", default=None, help="base checkpoint of a LoRA adapter")
    p.add_argument("--output", "--output-path", dest="output", required=True, help="where to write hf/ and inference/")
    p.add_argument("--overwrite", action="store_true", help="replace what is at --output already")
    p.add_argument("--dtype", choices=pdnlp.DTYPES, default=None,
                   help="the checkpoint's dtype (checked; weights are not converted)")
    pdnlp.add_no_ops(p, NO_OPS)
    p.add_argument("--no-progress", action="store_true", help="no progress bar or stage lines")
    args = p.parse_args(argv)
    pdnlp.notice_no_ops(args, NO_OPS, "export")
    from alignment.inference.export import export

    return write_output(args, lambda: export(args.model, args.output, args.base, args.no_progress, args.dtype),
                        lambda path: f"exported {args.model} -> {path}/hf (HF layout) and {path}/inference "
                                     "(paddle.inference, KV cache)")
