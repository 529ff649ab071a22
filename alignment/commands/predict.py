"""Generate for many prompts with an exported model (tools/export_model.py) through paddle.inference.

    python tools/predict.py --model exported/smollm2-ppo --prompts prompts.jsonl
        [--output answers.jsonl] [--prompt "..." ...] [--batch-size 8] [--max-new-tokens 64] [--raw]
        [--do-sample --temperature 0.7 --top-k 0 --top-p 0.9 --repetition-penalty 1.0 --seed 0]
        [--device auto|cpu|gpu] [--no-progress]

Prompts: --prompt (repeatable), --prompts FILE (JSON lines with a "prompt" key, whose other keys
are copied to the output, or plain text lines) or else stdin in the same formats. Each prompt is
wrapped in the checkpoint's chat template (unless --raw). Batches are left-padded and decoded by
alignment.models.generate, training's decoding loop and sampling with the same options (greedy
unless --do-sample), with the exported program standing in for the model: one call per batch fills
the KV cache, then one call per new token. Writes a JSON line per prompt (prompt, response,
prompt_tokens, new_tokens, finish_reason, response_ids) to --output or stdout, and a summary with
tokens/s to stderr. Runs on the GPU when Paddle has CUDA and a device (--device auto), else the CPU.
"""
from __future__ import annotations

import sys
import time
from typing import List

from alignment.tool_parser import ToolParser, positive_int

from alignment.fileio import refuse_to_replace


import paddle  # noqa: E402

from alignment.inference.batch_generation import encode, predict, read_prompts, write_jsonl  # noqa: E402
from alignment.inference.exported_model import find_export, load  # noqa: E402


def generation_config(args, info: dict):
    from alignment.models.generation import GenerationConfig

    return GenerationConfig(max_new_tokens=args.max_new_tokens, do_sample=args.do_sample,
                            temperature=args.temperature, top_k=args.top_k, top_p=args.top_p,
                            repetition_penalty=args.repetition_penalty, eos_token_id=info["eos_token_ids"] or None,
                            pad_token_id=info["pad_token_id"])


def parse_args(argv=None):
    p = ToolParser(__doc__)
    p.add_argument("--model", required=True, help="a directory written by tools/export_model.py")
    p.add_argument("--prompt", action="append", default=[], help="a prompt (repeatable)")
    p.add_argument("--prompts", default=None, help="JSON lines with a \"prompt\" key, or plain text lines")
    p.add_argument("--output", default=None, help="JSON lines out (default stdout)")
    p.add_argument("--overwrite", action="store_true", help="replace an existing --output")
    p.add_argument("--batch-size", type=positive_int, default=8)
    p.add_argument("--max-new-tokens", type=positive_int, default=64)
    p.add_argument("--raw", action="store_true", help="do not apply the chat template")
    p.add_argument("--do-sample", action="store_true", help="sample (default greedy)")
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--top-k", type=int, default=0, help="0 = off")
    p.add_argument("--top-p", type=float, default=1.0, help="1.0 = off")
    p.add_argument("--repetition-penalty", type=float, default=1.0, help="1.0 = off")
    p.add_argument("--seed", type=int, default=None, help="paddle.seed for sampling")
    p.add_argument("--device", choices=("auto", "cpu", "gpu"), default="auto")
    p.add_argument("--threads", type=positive_int, default=None, help="CPU math threads (MKL and OpenMP) of the predictor, "
                   "set for the whole process; default: leave them as they are (1 decoded fastest on 2 cores)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar (it is off when stderr is no TTY)")
    args = p.parse_args(argv)
    if args.batch_size < 1:
        p.error(f"--batch-size must be >= 1, got {args.batch_size}")
    return args


def main(argv=None) -> List[dict]:
    args = parse_args(argv)
    from alignment.models import Tokenizer
    from alignment.training.setup import user_errors

    with user_errors():  # a missing or old export, a bad prompt file or option: one line naming it, exit 2
        if args.output:
            refuse_to_replace(args.output, args.overwrite)
        records = read_prompts(args.prompt, args.prompts)
        start = time.perf_counter()
        lm = load(args.model, args.device, args.threads)
        tokenizer = Tokenizer.from_pretrained(find_export(args.model))
        config = generation_config(args, lm.info)
        rows = encode(tokenizer, records, args.raw, args.max_new_tokens, lm.info["max_position_embeddings"])
        loaded = time.perf_counter() - start
    if args.seed is not None:
        paddle.seed(args.seed)
    start = time.perf_counter()
    results = predict(lm, tokenizer, records, config, rows, args.batch_size, True if args.no_progress else None)
    seconds = time.perf_counter() - start
    with user_errors():  # an unwritable --output
        write_jsonl(results, args.output)
    new = sum(r["new_tokens"] for r in results)
    print(f"predict: {len(results)} prompts, {new} new tokens in {seconds:.2f} s = {new / seconds:.1f} tokens/s "
          f"({lm.device}, batch {args.batch_size}, {'sampling' if args.do_sample else 'greedy'}; "
          f"loading {loaded:.1f} s)", file=sys.stderr)
    return results

