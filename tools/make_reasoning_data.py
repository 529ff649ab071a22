"""Write verifiable prompts from reasoning-gym's procedural tasks as prompt-only JSONL (prompt, answer, task).

    python tools/make_reasoning_data.py [--task basic_arithmetic] [--train 400 --eval 50] [--output-dir data/reasoning]

The `answer` column reaches reward functions as a label (`accuracy` compares the completion's answer with it).
Each prompt asks for the final answer inside <answer></answer> tags, which the `format` reward checks.
reasoning-gym (Apache-2.0) generates the questions offline from a seed; train and eval use different seeds.
"""
from __future__ import annotations

import json
import os
import sys

if not __package__:  # run as a script from a checkout: make `alignment` importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from alignment.commands.tool_parser import ToolParser  # noqa: E402
from alignment.evaluation.tasks import BASIC_ARITHMETIC, reasoning_rows  # noqa: E402
from alignment.fileio import write_text_atomic  # noqa: E402

# the training files' difficulty (the held-out chain_sum task asks three terms; training mixes two and three)
TASK_OPTIONS = {"basic_arithmetic": BASIC_ARITHMETIC,
                "chain_sum": dict(min_terms=2, max_terms=3, min_digits=1, max_digits=1)}


def make_rows(task: str, size: int, seed: int) -> list:
    """reasoning-gym's `task` as training rows: prompt, answer, task."""
    return [{"prompt": row["input"], "answer": row["answer"], "task": task}
            for row in reasoning_rows(task, size, seed, TASK_OPTIONS.get(task, {}))]


def main(argv=None) -> None:
    parser = ToolParser(__doc__)
    parser.add_argument("--task", default="basic_arithmetic")
    parser.add_argument("--train", type=int, default=400)
    parser.add_argument("--eval", type=int, default=50)
    parser.add_argument("--seed", type=int, default=1234)
    parser.add_argument("--output-dir", default=os.path.join("data", "reasoning"))
    args = parser.parse_args(argv)
    for split, size, seed in (("train", args.train, args.seed), ("eval", args.eval, args.seed + 1)):
        rows = make_rows(args.task, size, seed)
        path = os.path.join(args.output_dir, f"{args.task}_{split}.jsonl")
        write_text_atomic(path, "".join(json.dumps(row) + "\n" for row in rows))
        print(f"{path}: {len(rows)} prompts")


if __name__ == "__main__":
    main()
