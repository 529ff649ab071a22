"""Generate for many prompts with an exported model (tools/export_model.py) through paddle.inference.

    python tools/predict.py --model exported/smollm2-ppo --prompts prompts.jsonl
        [--output answers.jsonl] [--prompt "..." ...] [--batch-size 8] [--max-new-tokens 64] [--raw]
        [--do-sample --temperature 0.7 --top-k 0 --top-p 0.9 --repetition-penalty 1.0 --seed 0]
        [--device auto|cpu|gpu] [--no-progress]
    python tools/predict.py --model_name_or_path exported/smollm2-ppo --mode static --dtype float32
        --data_file data.json --output_file output.json --decode_strategy sampling --top_p 0.7
        --src_length 1024 --max_length 64 --min_length 1 --batch_size 1 [--inference_model 1 --block_attn 1]

Prompts: --prompt (repeatable), --prompts FILE (JSON lines with a "prompt" key, whose other keys are copied to the
output, PaddleNLP's "src"/"tgt" lines, or plain text lines) or else stdin in the same formats. Each prompt is wrapped
in the checkpoint's chat template (unless --raw). Batches are left-padded and decoded by alignment.models.generate,
training's decoding loop and sampling with the same options, with the exported program standing in for the model:
one call per batch fills the KV cache, then one call per new token. Writes a JSON line per prompt (prompt, response,
prompt_tokens, new_tokens, finish_reason, response_ids) to --output or stdout, and a summary with tokens/s to
stderr. Runs on the GPU when Paddle has CUDA and a device (--device auto), else the CPU.

PaddleNLP's predictor.py flags are accepted: --model_name_or_path (= --model), --data_file (= --prompts),
--output_file (PaddleNLP's output lines {"src", "tgt", "output"} instead of ours), --max_length (= --max-new-tokens,
as PaddleNLP's predictor passes it to generate), --min_length (no eos before that many new tokens), --src_length
(keep the last N prompt tokens, as PaddleNLP truncates), --batch_size, --dtype (must be the model's; not converted),
--mode static (the export) or dynamic (the checkpoint, or an export's hf/, in this process; default: static when
there is an export), --decode_strategy greedy_search|sampling (beam_search is not built), --inference_model and
--block_attn (no effect here; a notice). Decoding: greedy unless --do-sample (our defaults: temperature 1, top_p 1,
top_k 0) or --decode_strategy sampling (PaddleNLP's: temperature 0.95, top_p 0.7, top_k 0); a sampling flag alone
samples as PaddleNLP does (its default strategy is sampling), with a notice; greedy search with a sampling value
that would change anything is refused.
"""
from __future__ import annotations

import os
import sys
import time
from typing import List

from alignment.commands import paddlenlp_flags as pdnlp
from alignment.fileio import refuse_to_replace
from alignment.commands.tool_parser import (ToolParser, non_negative_int, positive_int, positive_number,
                                            probability)

import paddle  # noqa: E402

from alignment.inference.batch_generation import (encode, paddlenlp_output, predict, read_prompts,  # noqa: E402
                                                  write_jsonl)
from alignment.inference.exported_model import (checkpoint_dir, find_export, has_export, load,  # noqa: E402
                                                load_checkpoint)


def generation_config(args, info: dict):
    from alignment.models.generation import GenerationConfig

    return GenerationConfig(max_new_tokens=args.max_new_tokens, do_sample=args.do_sample, **args.sampling,
                            repetition_penalty=args.repetition_penalty, min_new_tokens=args.min_new_tokens,
                            eos_token_id=info["eos_token_ids"] or None, pad_token_id=info["pad_token_id"])


def parse_args(argv=None):
    p = ToolParser(__doc__)
    p.add_argument("--model", "--model-name-or-path", dest="model", required=True,
                   help="a directory written by tools/export_model.py (or a checkpoint, with --mode dynamic)")
    p.add_argument("--prompt", action="append", default=[], help="a prompt (repeatable)")
    p.add_argument("--prompts", "--data-file", dest="prompts", default=None,
                   help="JSON lines with a \"prompt\" key or PaddleNLP's \"src\"/\"tgt\", or plain text lines")
    out = p.add_mutually_exclusive_group()
    out.add_argument("--output", default=None, help="JSON lines out (default stdout)")
    out.add_argument("--output-file", default=None, help="PaddleNLP's output lines {src, tgt, output}")
    p.add_argument("--overwrite", action="store_true", help="replace an existing --output / --output_file")
    p.add_argument("--batch-size", type=positive_int, default=8)
    p.add_argument("--max-new-tokens", "--max-length", dest="max_new_tokens", type=positive_int, default=64)
    p.add_argument("--min-new-tokens", "--min-length", dest="min_new_tokens", type=non_negative_int, default=0,
                   help="no eos before this many new tokens")
    p.add_argument("--src-length", type=positive_int, default=None, help="keep the last N tokens of each prompt")
    p.add_argument("--raw", action="store_true", help="do not apply the chat template")
    p.add_argument("--do-sample", action="store_true", help="sample (default greedy)")
    p.add_argument("--decode-strategy", choices=pdnlp.STRATEGIES, default=None, help="PaddleNLP's decoding key")
    p.add_argument("--temperature", type=positive_number, default=None)
    p.add_argument("--top-k", type=non_negative_int, default=None, help="0 = off")
    p.add_argument("--top-p", type=probability, default=None, help="1.0 = off")
    p.add_argument("--repetition-penalty", type=positive_number, default=1.0, help="1.0 = off")
    p.add_argument("--seed", type=non_negative_int, default=None, help="paddle.seed for sampling")
    p.add_argument("--mode", choices=("static", "dynamic"), default=None,
                   help="static: the exported program; dynamic: the checkpoint (default: static if exported)")
    p.add_argument("--dtype", choices=pdnlp.DTYPES, default=None, help="the model's dtype (checked, not converted)")
    pdnlp.add_no_ops(p, pdnlp.NO_OPS)
    p.add_argument("--device", choices=("auto", "cpu", "gpu"), default="auto")
    p.add_argument("--threads", type=positive_int, default=None, help="CPU math threads (MKL and OpenMP) of the "
                   "predictor, set for the whole process; default: leave them as they are (1 decoded fastest on 2 "
                   "cores)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar (it is off when stderr is no TTY)")
    args = p.parse_args(argv)
    try:
        args.do_sample, args.sampling, notice = pdnlp.decoding(args)
    except ValueError as err:
        p.error(str(err))
    if args.threads is not None and args.mode == "dynamic":
        p.error("--threads sets the exported program's threads; --mode dynamic runs the checkpoint in this process")
    if notice:
        print(notice, file=sys.stderr)
    pdnlp.notice_no_ops(args, pdnlp.NO_OPS, "predict")
    return args


def open_model(args):
    """(the model for `generate`, its tokenizer's directory) as --mode says: the exported program or the checkpoint."""
    mode = args.mode or ("dynamic" if not has_export(args.model)
                         and os.path.exists(os.path.join(checkpoint_dir(args.model), "config.json")) else "static")
    if mode == "static":
        lm, folder = load(args.model, args.device, args.threads), find_export(args.model)
    else:
        lm, folder = load_checkpoint(args.model, args.device), checkpoint_dir(args.model)
    pdnlp.check_dtype(args.dtype, lm.info["dtype"], f"{args.model} ({mode})")
    return lm, folder


def main(argv=None) -> List[dict]:
    args = parse_args(argv)
    from alignment.models import Tokenizer
    from alignment.training.setup import user_errors

    output = args.output or args.output_file
    with user_errors():  # a missing or old export, a bad prompt file or option: one line naming it, exit 2
        if output:
            refuse_to_replace(output, args.overwrite)
        records = read_prompts(args.prompt, args.prompts)
        start = time.perf_counter()
        lm, folder = open_model(args)
        tokenizer = Tokenizer.from_pretrained(folder)
        config = generation_config(args, lm.info)
        rows = encode(tokenizer, records, args.raw, args.max_new_tokens, lm.info["max_position_embeddings"],
                      args.src_length)
        loaded = time.perf_counter() - start
    if args.seed is not None:
        paddle.seed(args.seed)
    start = time.perf_counter()
    results = predict(lm, tokenizer, records, config, rows, args.batch_size, True if args.no_progress else None)
    seconds = time.perf_counter() - start
    with user_errors():  # an unwritable --output
        write_jsonl([paddlenlp_output(r) for r in results] if args.output_file else results, output)
    new = sum(r["new_tokens"] for r in results)
    print(f"predict: {len(results)} prompts, {new} new tokens in {seconds:.2f} s = {new / seconds:.1f} tokens/s "
          f"({lm.device}, batch {args.batch_size}, {'sampling' if args.do_sample else 'greedy'}; "
          f"loading {loaded:.1f} s)", file=sys.stderr)
    return results
