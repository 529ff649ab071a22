"""Batched generation for many prompts with an exported model: prompts read from JSON lines or text, encoded
with the chat template, left-padded, decoded by `alignment.models.generate` and written back as JSON lines."""
from __future__ import annotations

import json
import re
import sys
import time
from typing import List

import paddle

from alignment.data.tokenized import collate_prompts
from alignment.fileio import write_text_atomic
from alignment.inputs import InputError, parse_json, read_at_most, read_text
from alignment.models.generation import generate


def prompt_records(text: str, name: str) -> List[dict]:
    """The prompt records of a prompts file's text, line by line: a line that opens a JSON object with a key
    ('{"') must be one, with "prompt" (a string or a list of turns) or PaddleNLP's "src"; any other line is a plain
    text prompt. Blank lines are skipped; errors name the file and line."""
    records = []
    for number, line in enumerate(text.split("\n"), 1):
        if not line.strip():
            continue
        if len(line) > MAX_PROMPT_CHARS:
            raise InputError(f"{name} line {number}: longer than {MAX_PROMPT_CHARS} characters", name, number)
        if JSON_LINE.match(line):
            records.append(json_record(parse_json(line, name, number), f"{name} line {number}"))
        else:
            records.append({"prompt": line.rstrip("\r")})
        if len(records) > MAX_PROMPTS:
            raise InputError(f"{name}: more than {MAX_PROMPTS} prompts; split the file", name)
    return records


JSON_LINE = re.compile(r'\s*\{\s*"')


def json_record(record, where: str) -> dict:
    """A JSON line's record with its "prompt" (PaddleNLP's "src" / "tgt" turned into one)."""
    if not isinstance(record, dict):
        raise InputError(f"{where}: a line of a JSON-lines prompts file must be a JSON object")
    if "prompt" not in record and "src" in record:
        record = {**record, "prompt": paddlenlp_turns(record, where)}
    prompt = record.get("prompt")
    if not isinstance(prompt, str) and not (isinstance(prompt, list) and prompt
                                            and all(isinstance(turn, str) for turn in prompt)):
        raise InputError(f"{where}: a JSON line needs a \"prompt\" key (a string or a list of turns) or PaddleNLP's "
                         f"\"src\"")
    return record


def paddlenlp_turns(record: dict, where: str):
    """PaddleNLP's data file row (llm/predict/predictor.py): "src" a string, or for several rounds "src" and "tgt"
    lists, the conversation src[0], tgt[0], ..., src[-1] (the last round's answer is the one to generate)."""
    src, tgt = record["src"], record.get("tgt", "")
    if isinstance(src, str):
        return src
    if (not isinstance(src, list) or not src or not isinstance(tgt, list) or len(tgt) < len(src) - 1
            or not all(isinstance(t, str) for t in src + tgt)):
        raise ValueError(f"{where}: \"src\" must be a string, or a list of strings with a \"tgt\" list of the "
                         f"answers to all but the last")
    return [turn for pair in zip(src, tgt[: len(src) - 1] + [None]) for turn in pair if turn is not None]


def paddlenlp_output(result: dict) -> dict:
    """A result in the shape PaddleNLP's --output_file has: {"src", "tgt", "output"}."""
    return {"src": result.get("src", result["prompt"]), "tgt": result.get("tgt", ""), "output": result["response"]}


MAX_PROMPT_CHARS, MAX_PROMPTS = 1_000_000, 1_000_000  # per line, per file
MAX_PROMPTS_BYTES = 1 << 30


def read_prompts(prompts: List[str], prompts_file: str = None, stdin=None) -> List[dict]:
    """Records with a "prompt": the --prompt values, then the lines of prompts_file; stdin if neither is given."""
    records = [{"prompt": p} for p in prompts or []]
    if prompts_file:
        records += prompt_records(read_text(prompts_file, "prompts file", MAX_PROMPTS_BYTES), prompts_file)
    elif not records:
        records += prompt_records(read_at_most(stdin or sys.stdin, MAX_PROMPTS_BYTES), "stdin")
    if not records:
        raise ValueError("no prompts: give --prompt, --prompts FILE or lines on stdin")
    return records


def encode(tokenizer, records: List[dict], raw: bool, max_new_tokens: int, max_positions: int,
           src_length: int = None) -> List[List[int]]:
    """Token ids of each record's prompt (chat template unless raw), the last src_length of them if given (PaddleNLP
    truncates on the left), checked against the model's positions."""
    rows = []
    for i, record in enumerate(records, 1):
        prompt = record["prompt"]
        if raw and not isinstance(prompt, str):
            raise ValueError(f"prompt {i}: --raw needs a string prompt, not a list of turns")
        text = prompt if raw else tokenizer.apply_chat_template(tokenizer.chat_messages(prompt))
        ids = tokenizer.encode(text, add_special_tokens=True)
        if src_length is not None:
            ids = ids[-src_length:]
        if not ids:
            raise ValueError(f"prompt {i} is empty")
        if len(ids) + max_new_tokens > max_positions:
            raise ValueError(f"prompt {i} has {len(ids)} tokens; with --max-new-tokens {max_new_tokens} it "
                             f"exceeds the model's max_position_embeddings {max_positions} (--src_length N keeps "
                             f"the last N)")
        rows.append(ids)
    return rows


def left_pad(rows: List[List[int]], pad: int):
    """input_ids, attention_mask [b, longest] int64 tensors, the rows right-aligned (the training collator)."""
    batch = collate_prompts([{"input_ids": row} for row in rows], pad)
    return paddle.to_tensor(batch["input_ids"]), paddle.to_tensor(batch["attention_mask"])


def generate_rows(lm, rows: List[List[int]], config) -> List[List[int]]:
    """Each row's new token ids (up to and including an eos) by alignment.models.generate over lm."""
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


def write_jsonl(results: List[dict], output: str = None) -> None:
    lines = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in results)
    if output is None:
        sys.stdout.write(lines)
        sys.stdout.flush()
    else:
        write_text_atomic(output, lines)
