"""The tool demo's table: held-out accuracy of each arm before RL (the SFT model) and after, with wall and CPU times.

    python examples/tool_arithmetic/report.py --arm "with the calculator" outputs/smollm2-grpo-tools \
        --arm "no tools" outputs/smollm2-grpo-direct [--times outputs/tool_demo_times.tsv]

Reads each GRPO run's metrics.jsonl: its evaluation before the first step (the SFT model) and its last one, both
greedy on the held-out questions and scored by the run's gold judge (exact match of the last number of the final
assistant message). --times: lines of `arm-directory <tab> stage <tab> wall seconds <tab> CPU seconds` written by
examples/tool_demo.sh.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Dict, List, Tuple


def evaluations(output_dir: str) -> Tuple[dict, dict]:
    """(the first, the last) rows of metrics.jsonl that hold eval/gold_reward."""
    path = os.path.join(output_dir, "metrics.jsonl")
    if not os.path.exists(path):
        raise SystemExit(f"error: {path} not found (run the GRPO config first)")
    with open(path, encoding="utf-8") as f:
        rows = [row for row in map(json.loads, f) if "eval/gold_reward" in row]
    if len(rows) < 2:
        raise SystemExit(f"error: {path} holds {len(rows)} evaluations; a finished run has one before and one after")
    return rows[0], rows[-1]


def read_times(path: str) -> Dict[Tuple[str, str], Tuple[float, float]]:
    times = {}
    if path and os.path.exists(path):
        with open(path, encoding="utf-8") as f:
            for line in f:
                run, stage, wall, cpu = line.rstrip("\n").split("\t")
                times[(os.path.normpath(run), stage)] = (float(wall), float(cpu))
    return times


def minutes(seconds: float) -> str:
    return f"{int(seconds) // 60} min {int(seconds) % 60:02d} s"


def arm_figures(label: str, run: str, times: Dict[Tuple[str, str], Tuple[float, float]]) -> dict:
    before, after = evaluations(run)
    figures = {"arm": label, "run": run, "accuracy_after_sft": before["eval/gold_reward"],
               "accuracy_after_grpo": after["eval/gold_reward"], "tool_calls_after": after.get("eval/env/tool_calls")}
    for stage in ("sft", "grpo"):
        wall, cpu = times.get((os.path.normpath(run), stage), (None, None))
        figures[f"{stage}_wall_s"], figures[f"{stage}_cpu_s"] = wall, cpu
    return figures


def table(arms: List[dict]) -> str:
    lines = ["| arm | held-out accuracy after SFT | after GRPO | tool calls per question (after) | SFT wall / CPU "
             "| GRPO wall / CPU | total wall / CPU |", "| --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for arm in arms:
        calls = arm["tool_calls_after"]
        cells = [arm["arm"], f"{arm['accuracy_after_sft']:.2f}", f"**{arm['accuracy_after_grpo']:.2f}**",
                 "-" if calls is None else f"{calls:.2f}"]
        total = [0.0, 0.0]
        for stage in ("sft", "grpo"):
            wall, cpu = arm[f"{stage}_wall_s"], arm[f"{stage}_cpu_s"]
            cells.append("-" if wall is None else f"{minutes(wall)} / {minutes(cpu)}")
            total = [total[0] + (wall or 0), total[1] + (cpu or 0)]
        cells.append(f"{minutes(total[0])} / {minutes(total[1])}" if total[0] else "-")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def ledger(output_dir: str) -> List[dict]:
    rows = []
    folder = os.path.join(output_dir, "ledger")
    for name in sorted(os.listdir(folder)) if os.path.isdir(folder) else []:
        if name.startswith("steps-"):
            with open(os.path.join(folder, name), encoding="utf-8") as f:
                rows += [json.loads(line) for line in f]
    return rows


def same_trajectories(a: str, b: str) -> Tuple[int, int]:
    """(how many trained samples of two runs' ledgers (rollout_ledger) hold the same token ids, policy-token mask and
    reward, in order, of how many): an environment arm and its agent arm should agree on every one."""
    left, right = ledger(a), ledger(b)
    if not left or not right:
        raise SystemExit(f"error: no ledger in {a if not left else b} (rollout_ledger: true)")
    same = sum(x["response_ids"] == y["response_ids"] and x["policy_token"] == y["policy_token"]
               and x["reward"] == y["reward"] for x, y in zip(left, right))
    return same, max(len(left), len(right))


def main(argv=None) -> str:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--arm", nargs=2, action="append", metavar=("LABEL", "GRPO_OUTPUT_DIR"), required=True)
    parser.add_argument("--times", default=None, help="the wall and CPU seconds of each run (see above)")
    parser.add_argument("--same", nargs=2, metavar=("RUN", "OTHER_RUN"),
                        help="also compare two runs' ledgers sample by sample (an environment arm and its agent arm)")
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    from benchmarks import record

    record.add_arguments(parser)  # tool_demo_<stamp>.json: --results-dir, --record (the docs' table) or --no-save
    args = parser.parse_args(argv)
    times = read_times(args.times)
    arms = [arm_figures(label, run, times) for label, run in args.arm]
    text = table(arms)
    figures = {"arms": arms}
    if args.same:
        same, total = same_trajectories(*args.same)
        figures["same_trajectories"] = {"runs": list(args.same), "same": same, "samples": total}
        text += f"\n\nsame trajectories ({args.same[0]} / {args.same[1]}): {same} of {total} trained samples"
    print(text)
    if not args.no_save:
        record.save("tool_demo", figures, record.results_dir(args))
    return text


if __name__ == "__main__":
    sys.exit(main() and 0)
