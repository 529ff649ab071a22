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

import json
import os
import sys
import time
from types import SimpleNamespace
from typing import List, NamedTuple, Optional

if not __package__:  # run as a script from a checkout: make `alignment` importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from alignment.tool_parser import ToolParser  # noqa: E402

from alignment.cpu_env import apply_cpu_defaults  # noqa: E402

apply_cpu_defaults()  # this CPU's thread and MKL settings, before paddle is imported

import paddle  # noqa: E402

from alignment.models.llama import positions_from_mask  # noqa: E402
from alignment.models.static_decode import EXPORT_FORMAT  # noqa: E402

EXPORT_INFO = "export.json"  # in <export>/inference/, written by tools/export_model.py


class StepOutput(NamedTuple):
    logits: paddle.Tensor  # [b, 1, vocab]
    past_key_values: list  # per layer (k, v), each [b, kv_heads, t, d]


class ExportedLM:
    """The exported program behind the call `generate` makes of a model:
    lm(input_ids, attention_mask=, position_ids=, past_key_values=) -> .logits [b, 1, vocab], .past_key_values.
    Without past_key_values it is the prefill (empty caches, positions from the mask, as the dynamic model)."""

    def __init__(self, predictor, info: dict, device: str, threads: Optional[int] = None):
        self.predictor, self.info, self.device, self.threads = predictor, info, device, threads
        self.config = SimpleNamespace(vocab_size=info["vocab_size"])  # all `generate` reads of the config

    def __call__(self, input_ids, attention_mask=None, position_ids=None, past_key_values=None, **_ignored):
        if attention_mask is None:
            attention_mask = paddle.ones_like(input_ids)
        if past_key_values is None:
            shape = [input_ids.shape[0], self.info["num_key_value_heads"], 0, self.info["head_dim"]]
            caches = [paddle.zeros(shape, self.info["dtype"])] * (2 * self.info["num_hidden_layers"])
        else:
            caches = [t for kv in past_key_values for t in kv]
        if position_ids is None:
            if past_key_values is not None:
                raise ValueError("a decode step needs position_ids")
            position_ids = positions_from_mask(attention_mask)
        outs = self.predictor.run([input_ids, attention_mask.astype("int64"), position_ids, *caches])
        # copies: the returned tensors share the predictor's output buffers, which the next run may write while
        # reading them as inputs (measured: a batch of 2 after a batch of 3 decoded wrong without the copies)
        outs = [t.clone() for t in outs]
        return StepOutput(outs[0].unsqueeze(1), list(zip(outs[1::2], outs[2::2])))


def find_export(model_dir: str) -> str:
    """The inference/ folder of an export (or model_dir itself when it is that folder)."""
    for folder in (os.path.join(model_dir, "inference"), model_dir):
        if os.path.exists(os.path.join(folder, EXPORT_INFO)):
            return folder
    raise FileNotFoundError(f"{model_dir}: no inference/{EXPORT_INFO} (export it with tools/export_model.py)")


def read_info(folder: str) -> dict:
    path = os.path.join(folder, EXPORT_INFO)
    with open(path, encoding="utf-8") as f:
        info = json.load(f)
    if info.get("format") != EXPORT_FORMAT:
        raise ValueError(f"{path}: written by an older tools/export_model.py (a fixed-width graph without a KV "
                         f"cache, format {info.get('format')!r}, expected {EXPORT_FORMAT!r}); re-export the model")
    return info


def pick_device(device: str = "auto") -> str:
    """"gpu" when asked for, or (auto) when Paddle is built with CUDA and sees a device; else "cpu"."""
    has_gpu = paddle.is_compiled_with_cuda() and paddle.device.cuda.device_count() > 0
    if device == "gpu" and not has_gpu:
        raise ValueError("--device gpu: this Paddle has no CUDA device")
    return "gpu" if device == "gpu" or (device == "auto" and has_gpu) else "cpu"


def load(model_dir: str, device: str = "auto", threads: Optional[int] = None) -> ExportedLM:
    """The exported program of model_dir as an ExportedLM on the chosen device. threads: the CPU predictor's math
    threads, which Paddle applies to MKL and OpenMP alike, process-wide; None keeps the process's MKL_NUM_THREADS,
    so the numbers of anything else the process computes do not change (a predictor made with 1 thread turned
    later in-process training runs' results into a 1-thread MKL's). Measured on 2 cores
    (benchmarks/bench_predict.py): 1 thread decoded faster (SmolLM2 1.03x of the dynamic model's speed vs 0.89x
    with 2; the tiny model 0.68x vs 0.44x): pass --threads 1 for a process that only predicts."""
    from paddle import inference

    folder = find_export(model_dir)
    info = read_info(folder)
    files = [os.path.join(folder, info["program"] + ext) for ext in (".json", ".pdiparams")]
    for file in files:
        if not os.path.exists(file):
            raise FileNotFoundError(f"{file}: missing from the export; re-export the model")
    device = pick_device(device)
    paddle.set_device(device)
    config = inference.Config(*files)
    if device == "gpu":
        config.enable_use_gpu(256, 0)
    else:
        config.disable_gpu()
        # measured (paddle 3.3.1): with oneDNN the CPU predictor gave all-zero logits for the old fixed-width graph
        # and crashes ("corrupted double-linked list") on this program; the plain kernels match the dynamic model
        config.disable_mkldnn()
        # the predictor sets its math threads for the whole process (MKL and OpenMP); unless asked, keep the
        # process's own, so a program that also trains (or a test) computes as before
        config.set_cpu_math_library_num_threads(threads or int(os.environ.get("MKL_NUM_THREADS") or 1))
    config.disable_glog_info()
    return ExportedLM(inference.create_predictor(config), info, device, threads)


def parse_line(line: str, where: str):
    """A JSON object with "prompt" (its record) or a plain text line ({"prompt": line}); None for a blank line."""
    text = line.rstrip("\r\n")
    if not text.strip():
        return None
    if text.lstrip().startswith("{"):
        try:
            record = json.loads(text)
        except ValueError:
            record = None
        if isinstance(record, dict):
            if not isinstance(record.get("prompt"), (str, list)):
                raise ValueError(f"{where}: a JSON line needs a \"prompt\" key (a string or a list of turns)")
            return record
    return {"prompt": text}


def read_prompts(prompts: List[str], prompts_file: str = None, stdin=None) -> List[dict]:
    """Records with a "prompt": the --prompt values, then the lines of prompts_file; stdin if neither is given."""
    records = [{"prompt": p} for p in prompts or []]
    if prompts_file:
        with open(prompts_file, encoding="utf-8") as f:
            lines = [(f"{prompts_file}:{i}", line) for i, line in enumerate(f, 1)]
    elif not records:
        lines = [(f"stdin:{i}", line) for i, line in enumerate(stdin or sys.stdin, 1)]
    else:
        lines = []
    records += [r for r in (parse_line(line, where) for where, line in lines) if r is not None]
    if not records:
        raise ValueError("no prompts: give --prompt, --prompts FILE or lines on stdin")
    return records


def encode(tokenizer, records: List[dict], raw: bool, max_new_tokens: int, max_positions: int) -> List[List[int]]:
    """Token ids of each record's prompt (chat template unless raw), checked against the model's positions."""
    rows = []
    for i, record in enumerate(records, 1):
        prompt = record["prompt"]
        if raw and not isinstance(prompt, str):
            raise ValueError(f"prompt {i}: --raw needs a string prompt, not a list of turns")
        text = prompt if raw else tokenizer.apply_chat_template(tokenizer.chat_messages(prompt))
        ids = tokenizer.encode(text, add_special_tokens=True)
        if not ids:
            raise ValueError(f"prompt {i} is empty")
        if len(ids) + max_new_tokens > max_positions:
            raise ValueError(f"prompt {i} has {len(ids)} tokens; with --max-new-tokens {max_new_tokens} it "
                             f"exceeds the model's max_position_embeddings {max_positions}")
        rows.append(ids)
    return rows


def left_pad(rows: List[List[int]], pad: int):
    """input_ids, attention_mask [b, longest] int64 tensors, the rows right-aligned (the training collator)."""
    from alignment.data.tokenized import collate_prompts

    batch = collate_prompts([{"input_ids": row} for row in rows], pad)
    return paddle.to_tensor(batch["input_ids"]), paddle.to_tensor(batch["attention_mask"])


def generate_rows(lm, rows: List[List[int]], config) -> List[List[int]]:
    """Each row's new token ids (up to and including an eos) by alignment.models.generate over lm."""
    from alignment.models.generation import generate

    ids, mask = left_pad(rows, config.pad_token_id)
    out = generate(lm, ids, mask, config)
    response = out.sequences[:, ids.shape[1]:].numpy()
    counts = out.response_mask.sum(axis=1).numpy()
    return [response[i, : int(n)].tolist() for i, n in enumerate(counts)]


def predict(lm, tokenizer, records: List[dict], config, rows: List[List[int]], batch_size: int = 8,
            no_bar: bool = None) -> List[dict]:
    """One output record per prompt, generated batch_size prompts at a time (in the given order), with a progress
    bar (prompts, tokens/s) on stderr unless no_bar (None: a bar only when stderr is a terminal)."""
    from tqdm import tqdm

    eos, results, new_tokens, start = set(config.eos_ids), [], 0, time.perf_counter()
    bar = tqdm(total=len(records), unit="prompt", desc="predict", file=sys.stderr, disable=no_bar)
    for first in range(0, len(records), batch_size):
        for record, prompt_ids, new in zip(records[first: first + batch_size], rows[first: first + batch_size],
                                           generate_rows(lm, rows[first: first + batch_size], config)):
            stopped = bool(new) and new[-1] in eos
            results.append({**record, "response": tokenizer.decode([t for t in new if t not in eos]),
                            "prompt_tokens": len(prompt_ids), "new_tokens": len(new),
                            "finish_reason": "eos" if stopped else "length", "response_ids": new})
            new_tokens += len(new)
        bar.update(min(batch_size, len(records) - first))
        bar.set_postfix_str(f"{new_tokens / (time.perf_counter() - start):.1f} tokens/s")
    bar.close()
    return results


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
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--raw", action="store_true", help="do not apply the chat template")
    p.add_argument("--do-sample", action="store_true", help="sample (default greedy)")
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--top-k", type=int, default=0, help="0 = off")
    p.add_argument("--top-p", type=float, default=1.0, help="1.0 = off")
    p.add_argument("--repetition-penalty", type=float, default=1.0, help="1.0 = off")
    p.add_argument("--seed", type=int, default=None, help="paddle.seed for sampling")
    p.add_argument("--device", choices=("auto", "cpu", "gpu"), default="auto")
    p.add_argument("--threads", type=int, default=None, help="CPU math threads (MKL and OpenMP) of the predictor, "
                   "set for the whole process; default: leave them as they are (1 decoded fastest on 2 cores)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar (it is off when stderr is no TTY)")
    args = p.parse_args(argv)
    if args.batch_size < 1:
        p.error(f"--batch-size must be >= 1, got {args.batch_size}")
    return args


def write_jsonl(results: List[dict], output: str = None) -> None:
    lines = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in results)
    if output is None:
        sys.stdout.write(lines)
        sys.stdout.flush()
    else:
        with open(output, "w", encoding="utf-8") as f:
            f.write(lines)


def main(argv=None) -> List[dict]:
    args = parse_args(argv)
    from alignment.models import Tokenizer
    from alignment.training.setup import user_errors

    with user_errors():  # a missing or old export, a bad prompt file or option: one line naming it, exit 2
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


if __name__ == "__main__":
    main()
