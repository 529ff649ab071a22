"""Side by side: the eval generations of a PPO/GRPO run before training (step 0) and after (last step).

    python tools/show_generations.py outputs/smollm2-ppo [--samples 3]

Reads `<output_dir>/eval_generations.jsonl` (written by run_ppo.py's evaluation) and prints the mean reward and
gold reward at both steps, how many answers changed, then the changed answers whose (gold) reward moved most, before
and after. A multi-turn run's rows are whole episodes: the means add turns and tool calls, and each episode is shown
turn by turn (the policy's turns, tool results and the environment's messages).
"""
from __future__ import annotations

import json
import os
import textwrap

from alignment.inputs import NUMBER, TEXT, check_keys, integer, json_lines
from alignment.commands.tool_parser import ToolParser, non_negative_int


def load(output_dir: str):
    path = os.path.join(output_dir, "eval_generations.jsonl")
    if not os.path.exists(path):
        raise SystemExit(f"error: {path} not found (run PPO with eval_datasets set)")
    by_step = {}
    for line, row in json_lines(path, "generations file"):
        check_keys(row, ROW_KEYS, path, required=("step", "prompt", "reward"), what="generation row", line=line)
        by_step.setdefault(row["step"], []).append(row)
    return by_step


ROW_KEYS = {"step": integer(0), "completion": TEXT, "reward": NUMBER, "gold_reward": NUMBER}


EPISODE_KEYS = ("turns", "tool_calls", "tool_errors")


def said(row) -> str:
    """What a row's policy said: its completion, or a multi-turn episode's whole conversation."""
    return json.dumps(row["messages"]) if "messages" in row else row["completion"]


def episode_summary(row) -> str:
    if "messages" not in row:
        return ""
    cut = ", cut by the limits" if row.get("truncated") else ""
    return f", {row['turns']} turns, {row['tool_calls']} tool calls ({row['tool_errors']} errors){cut}"


def shown(row) -> str:
    """The completion wrapped at 100 columns, or an episode's messages after the first prompt, one per block."""
    if "messages" not in row:
        return textwrap.fill(row["completion"], 100)
    messages = [m for m in row["messages"] if m["role"] != "system"][1:]  # the prompt is printed above
    return "\n".join(textwrap.fill(m["content"], 100, initial_indent=f"[{m['role']}] ",
                                    subsequent_indent="    ", replace_whitespace=False) for m in messages)


def mean(rows, key):
    values = [r[key] for r in rows if key in r]
    return sum(values) / len(values) if values else float("nan")


def main(argv=None):
    parser = ToolParser(__doc__)
    parser.add_argument("output_dir")
    parser.add_argument("--samples", type=non_negative_int, default=3)
    args = parser.parse_args(argv)
    by_step = load(args.output_dir)
    first, last = min(by_step), max(by_step)
    before, after = by_step[first], by_step[last]
    for key in ("reward", "gold_reward") + (EPISODE_KEYS if "messages" in before[0] else ()):
        print(f"{key:12s} step {first}: {mean(before, key):.4f}   step {last}: {mean(after, key):.4f}")
    after_by_prompt = {json.dumps(r["prompt"]): r for r in after}
    pairs = [(row, after_by_prompt.get(json.dumps(row["prompt"]))) for row in before]
    changed = [(b, a) for b, a in pairs if a is not None and said(a) != said(b)]
    print(f"{len(changed)} of {len(pairs)} answers changed; showing the {min(args.samples, len(changed))} whose "
          f"{'gold ' if changed and 'gold_reward' in changed[0][0] else ''}reward moved most")
    score = "gold_reward" if changed and "gold_reward" in changed[0][0] else "reward"
    changed.sort(key=lambda pair: abs(pair[1][score] - pair[0][score]), reverse=True)
    for row, other in changed[: args.samples]:
        print("\n" + "=" * 100 + f"\nPROMPT: {row['prompt']}")
        for label, r in (("BEFORE", row), ("AFTER", other)):
            if r is not None:
                gold = f", gold {r['gold_reward']:.3f}" if "gold_reward" in r else ""
                print(f"--- {label} (reward {r['reward']:.3f}{gold}{episode_summary(r)})\n" + shown(r))

