"""Write verifiable prompts from reasoning-gym's procedural tasks as prompt-only JSONL (prompt, answer, task), and
worked solutions of chain sums as SFT rows (alpaca: instruction, input, output).

    python tools/make_reasoning_data.py [--task basic_arithmetic] [--train 400 --eval 50] [--output-dir data/reasoning]
    python tools/make_reasoning_data.py --task chain_sum --train 0 --eval 0 --worked 1000 --seed 500000

The `answer` column reaches reward functions as a label (`accuracy` compares the completion's answer with it).
Each prompt asks for the final answer inside <answer></answer> tags, which the `format` reward checks.
reasoning-gym (Apache-2.0) generates item i of a seed from seed + i, so the splits take consecutive, disjoint
seed ranges: train from --seed, then eval, then worked. A split of size 0 is not written.
"""
from __future__ import annotations

import json
import os
import re
from typing import List

from alignment.commands.tool_parser import ToolParser
from alignment.evaluation.tasks import BASIC_ARITHMETIC, reasoning_rows
from alignment.fileio import write_text_atomic
from alignment.inputs import InputError

# the training files' difficulty (the held-out chain_sum task asks three terms; training mixes two and three)
TASK_OPTIONS = {"basic_arithmetic": BASIC_ARITHMETIC,
                "chain_sum": dict(min_terms=2, max_terms=3, min_digits=1, max_digits=1)}
CHAIN = re.compile(r"(\d+(?: [+-] \d+)+) =$")


def make_rows(task: str, size: int, seed: int) -> list:
    """reasoning-gym's `task` as training rows: prompt, answer, task."""
    return [{"prompt": row["input"], "answer": row["answer"], "task": task}
            for row in reasoning_rows(task, size, seed, TASK_OPTIONS.get(task, {}))]


def worked_solution(question: str) -> str:
    """A chain sum solved one operation a line, left to right: "6 - 2 + 5 =" -> "6 - 2 = 4\\n4 + 5 = 9\\n
    <answer>9</answer>"."""
    found = CHAIN.search(question.strip())
    if found is None:
        raise ValueError(f"not a chain sum: {question!r}")
    terms = found.group(1).split()
    total, lines = int(terms[0]), []
    for operator, term in zip(terms[1::2], terms[2::2]):
        result = total + int(term) if operator == "+" else total - int(term)
        lines.append(f"{total} {operator} {term} = {result}")
        total = result
    return "\n".join(lines) + f"\n<answer>{total}</answer>"


def worked_rows(size: int, seed: int) -> List[dict]:
    """Chain sums with their worked solutions as alpaca SFT rows."""
    rows = []
    for row in reasoning_rows("chain_sum", size, seed, TASK_OPTIONS["chain_sum"]):
        output = worked_solution(row["input"].split("\n")[0])
        assert output.endswith(f"<answer>{row['answer']}</answer>"), (row, output)
        rows.append({"instruction": row["input"], "input": "", "output": output})
    return rows


def main(argv=None) -> None:
    parser = ToolParser(__doc__)
    parser.add_argument("--task", default="basic_arithmetic")
    parser.add_argument("--train", type=int, default=400)
    parser.add_argument("--eval", type=int, default=50)
    parser.add_argument("--worked", type=int, default=0, help="chain sums with worked solutions (SFT rows)")
    parser.add_argument("--seed", type=int, default=1234)
    parser.add_argument("--output-dir", default=os.path.join("data", "reasoning"))
    args = parser.parse_args(argv)
    for key in ("train", "eval", "worked"):
        if getattr(args, key) < 0:
            raise InputError(f"--{key}: a number of rows is 0 or more, not {getattr(args, key)}")
    if args.worked and args.task != "chain_sum":
        raise InputError(f"--worked: worked solutions exist for --task chain_sum only, not {args.task}")
    seed = args.seed
    for split, size in (("train", args.train), ("eval", args.eval), ("worked", args.worked)):
        if size > 0:
            rows = worked_rows(size, seed) if split == "worked" else make_rows(args.task, size, seed)
            path = os.path.join(args.output_dir, f"{args.task}_{split}.jsonl")
            write_text_atomic(path, "".join(json.dumps(row) + "\n" for row in rows))
            print(f"{path}: {len(rows)} rows")
        seed += size


if __name__ == "__main__":
    main()
