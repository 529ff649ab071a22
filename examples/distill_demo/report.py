"""The distillation demo's table and plot: held-out accuracy of each arm against the CPU minutes it took.

    python examples/distill_demo/report.py --times outputs/distill_demo_times.tsv \
        [--plot docs/stages/distillation_demo.png] [--json outputs/distill_demo_result.json]

Reads examples/distill_demo.sh's times (arm, stage, wall s, CPU s, start epoch s per line), the distillation and
GRPO runs' metrics.jsonl (their greedy held-out evaluations: before the first step, every eval_steps, after the
last) and the SFT arm's held-out episodes (tools/judge_policy.py --output). Points inside a run are placed on the
CPU axis by their wall time (a run's CPU time spread evenly over its wall time); a run's last point is its total.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
from typing import Dict, List, Tuple

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))  # `alignment`

RUNS = {"distill": "outputs/distill-demo-distill", "grpo": "outputs/distill-demo-grpo"}
SFT_HELDOUT = "outputs/distill-demo-sft/heldout.jsonl"
TEACHER_RUN = "outputs/smollm2-grpo-tools"
LABELS = {"distill": "on-policy distillation (sampled_kl)", "sft": "SFT on the teacher's answers",
          "grpo": "GRPO, accuracy reward"}


def read_times(path: str) -> Dict[Tuple[str, str], Tuple[float, float, float]]:
    times = {}
    with open(path, encoding="utf-8") as f:
        for line in f:
            arm, stage, wall, cpu, start = line.rstrip("\n").split("\t")
            times[(arm, stage)] = (float(wall), float(cpu), float(start))
    return times


def metrics(run: str) -> List[dict]:
    with open(os.path.join(run, "metrics.jsonl"), encoding="utf-8") as f:
        return [json.loads(line) for line in f]


def run_points(run: str, wall: float, cpu: float, start: float) -> List[Tuple[float, float, int]]:
    """(CPU minutes into the run, held-out accuracy, step) of each evaluation of a PPO-family run."""
    rows = metrics(run)
    starts = {row["step"]: row["time/step_start"] for row in rows if "time/step_start" in row}
    points = []
    for row in rows:
        if "eval/gold_reward" not in row:
            continue
        after = starts.get(row["step"] + 1)  # the evaluation after step s ends before step s + 1 starts
        seconds = wall if after is None else min(wall, after - start)
        points.append((cpu * seconds / wall / 60, row["eval/gold_reward"], row["step"]))
    return points


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--times", required=True)
    parser.add_argument("--plot", default=None)
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    times = read_times(args.times)
    curves = {arm: run_points(run, *times[(arm, arm)]) for arm, run in RUNS.items()}
    student = curves["distill"][0][1]
    with open(SFT_HELDOUT, encoding="utf-8") as f:
        episodes = [json.loads(line) for line in f]
    sft_accuracy = sum(e["gold_reward"] > 0 for e in episodes) / len(episodes)
    sft_stages = [times[("sft", stage)] for stage in ("teacher_answers", "sft", "eval")]
    curves["sft"] = [(0.0, student, 0), (sum(cpu for _, cpu, _ in sft_stages) / 60, sft_accuracy, 20)]
    walls = {"distill": times[("distill", "distill")][0], "grpo": times[("grpo", "grpo")][0],
             "sft": sum(wall for wall, _, _ in sft_stages)}
    teacher = [row["eval/gold_reward"] for row in metrics(TEACHER_RUN) if "eval/gold_reward" in row][-1] \
        if os.path.exists(os.path.join(TEACHER_RUN, "metrics.jsonl")) else None
    lines = ["| arm (from the half-depth student) | held-out accuracy before | after | CPU minutes | wall minutes |",
             "| --- | ---: | ---: | ---: | ---: |"]
    for arm in ("distill", "sft", "grpo"):
        points = curves[arm]
        lines.append(f"| {LABELS[arm]} | {points[0][1]:.2f} | **{points[-1][1]:.2f}** | {points[-1][0]:.1f} | "
                     f"{walls[arm] / 60:.1f} |")
    student_cpu = sum(times[("student", s)][1] for s in ("drop", "sft")) / 60
    print("\n".join(lines))
    print(f"\nthe student (15 of 30 layers, then SFT: {student_cpu:.1f} CPU minutes, common to all arms) starts at "
          f"{student:.2f}" + (f"; the teacher scores {teacher:.2f}" if teacher is not None else ""))
    from alignment.cpu_env import machine_facts

    result = {"benchmark": "distill_demo", "machine": machine_facts(),
              "date": datetime.datetime.now().isoformat(timespec="seconds"), "cpu": cpu_model(),
              "commit": commit(), "student_accuracy": student, "teacher_accuracy": teacher,
              "student_cpu_minutes": student_cpu,
              "arms": {arm: {"points": [{"cpu_minutes": c, "accuracy": a, "step": s} for c, a, s in curves[arm]],
                             "wall_minutes": walls[arm] / 60} for arm in curves}}
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(result, f, indent=2)
    if args.plot:
        plot(curves, teacher, args.plot)
    return 0


def plot(curves, teacher, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    for arm, marker in (("distill", "o"), ("sft", "s"), ("grpo", "^")):
        xs, ys = [p[0] for p in curves[arm]], [p[1] for p in curves[arm]]
        ax.plot(xs, ys, marker=marker, label=LABELS[arm])
    if teacher is not None:
        ax.axhline(teacher, color="gray", linestyle="--", label=f"teacher ({teacher:.2f})")
    ax.set_xlabel("CPU minutes of the arm (2 cores)")
    ax.set_ylabel("held-out accuracy (100 questions, greedy)")
    ax.set_ylim(-0.02, 1.02)
    ax.legend(loc="best", fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    print(f"plot: {path}")


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            info = f.read()
        fields = {}
        for line in info.splitlines():
            key, _, value = line.partition(":")
            fields.setdefault(key.strip(), value.strip())
        return f"{fields.get('model name')} (family {fields.get('cpu family')}, model {fields.get('model')})"
    except OSError:
        return "unknown"


def commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


if __name__ == "__main__":
    sys.exit(main())
