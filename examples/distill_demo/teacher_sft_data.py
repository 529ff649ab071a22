"""The SFT arm's data: the teacher's greedy episodes (tools/judge_policy.py --output rows, each with the episode's
`messages`) as SFT rows {"messages": [...]} - every episode, right or wrong, as sequence-level distillation takes
the teacher's answers; an episode cut off after a tool call ends at its last assistant message.

    python examples/distill_demo/teacher_sft_data.py --episodes outputs/distill_demo/teacher_episodes.jsonl \
        --output outputs/distill_demo/teacher_sft.jsonl
"""
from __future__ import annotations

import argparse
import json


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", required=True)
    parser.add_argument("--output", required=True)
    args = parser.parse_args(argv)
    rows, correct = [], 0
    with open(args.episodes, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            episode = json.loads(line)
            if "messages" not in episode:
                raise SystemExit(f"error: {args.episodes}:{number}: no 'messages' (judge_policy without --environment?)")
            messages = list(episode["messages"])
            while messages and messages[-1]["role"] != "assistant":  # cut off after a tool call: no final answer
                messages.pop()
            if any(m["role"] == "assistant" for m in messages):
                rows.append({"messages": messages})
                correct += episode["gold_reward"] > 0
    with open(args.output, "w", encoding="utf-8") as f:
        f.write("".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows))
    print(f"{args.output}: {len(rows)} teacher episodes ({correct} with the right answer; {number - len(rows)} "
          "without an assistant message left out)")
    return len(rows)


if __name__ == "__main__":
    main()
