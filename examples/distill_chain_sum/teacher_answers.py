"""The SFT arm's data: the teacher's greedy answers (alignment-eval's items.jsonl) as alpaca SFT rows - every
answer, right or wrong, as sequence-level distillation takes the teacher's answers.

    python examples/distill_chain_sum/teacher_answers.py --items outputs/distill-chain-sum/teacher/items.jsonl \
        --output outputs/distill-chain-sum/teacher_answers.jsonl
"""
from __future__ import annotations

import argparse
import json


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--items", required=True)
    parser.add_argument("--output", required=True)
    args = parser.parse_args(argv)
    rows, correct = [], 0
    with open(args.items, encoding="utf-8") as f:
        for item in map(json.loads, f):
            sample = item["samples"][0]
            rows.append({"instruction": item["prompt"], "input": "", "output": sample["completion"]})
            correct += bool(sample.get("correct"))
    with open(args.output, "w", encoding="utf-8") as f:
        f.write("".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows))
    print(f"{args.output}: {len(rows)} teacher answers ({correct} right)")
    return len(rows)


if __name__ == "__main__":
    main()
