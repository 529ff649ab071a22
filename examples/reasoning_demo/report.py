"""The verifiable-reward demo's result: held-out pass@1 / pass@8 over training minutes, per seed, from
alignment-eval's directories, and the gain with its paired 95% CI; a result file (CPU, date, commit) and a plot.

    python examples/reasoning_demo/report.py --run outputs/smollm2-grpo-chain-sum-s42 [--run ...] \
        [--before DIR] [--task chain_sum] [--transfer basic_arithmetic] [--plot PNG] [--note TEXT] \
        [--record | --results-dir DIR]

Each --run is a GRPO output directory holding metrics.jsonl and evals/step-N/{greedy,n8}/<task>/ written by
examples/reasoning_demo.sh (step-0 is the model GRPO starts from); --before is the same layout's evaluation of
the model before the worked-solutions SFT (the instruct model), recorded for reference. Training minutes at step N
are the summed generate, score and train times of steps 1..N (evaluations and checkpoint saves excluded).
"""
from __future__ import annotations

import argparse
import json
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from alignment.evaluation.report import compare  # noqa: E402


def training_minutes(run: str) -> dict:
    """{step: minutes of training up to and including it}."""
    minutes, total = {0: 0.0}, 0.0
    with open(os.path.join(run, "metrics.jsonl"), encoding="utf-8") as f:
        for row in map(json.loads, f):
            if "time/train" in row:
                total += sum(row.get(k, 0.0) for k in ("time/generate", "time/score", "time/train")) / 60
                minutes[row["step"]] = total
    return minutes


def summary(path: str) -> dict:
    with open(os.path.join(path, "summary.json"), encoding="utf-8") as f:
        return json.load(f)["summary"]


def point(where: str, task: str, transfer: str) -> dict:
    """One model's figures from <where>/{greedy,n8}/<task>: greedy pass@1, sampled pass@1 and pass@8, transfer."""
    figures = {"greedy": summary(os.path.join(where, "greedy", task))["pass@1"]}
    if os.path.isdir(os.path.join(where, "n8", task)):
        sampled = summary(os.path.join(where, "n8", task))
        figures.update({"sampled_pass@1": sampled["pass@1"], "sampled_pass@8": sampled["pass@8"]})
    if os.path.isdir(os.path.join(where, "greedy", transfer)):
        figures["transfer_greedy"] = summary(os.path.join(where, "greedy", transfer))["pass@1"]
    return figures


def seed_curve(run: str, task: str, transfer: str) -> dict:
    evals, minutes = os.path.join(run, "evals"), training_minutes(run)
    steps = sorted(int(m.group(1)) for m in (re.fullmatch(r"step-(\d+)", d) for d in os.listdir(evals)) if m)
    points = []
    for step in steps:
        figures = point(os.path.join(evals, f"step-{step}"), task, transfer)
        points.append({"step": step, "train_minutes": minutes.get(step), **figures})
    first, last = f"step-{steps[0]}", f"step-{steps[-1]}"
    gain = {"greedy": compare(os.path.join(evals, first, "greedy", task),
                              os.path.join(evals, last, "greedy", task))["difference"]["pass@1"]}
    for variant, metric in (("n8", "pass@1"), ("n8", "pass@8")):
        if os.path.isdir(os.path.join(evals, last, variant, task)):
            gain[f"sampled_{metric}"] = compare(os.path.join(evals, first, variant, task),
                                                os.path.join(evals, last, variant, task))["difference"][metric]
    if os.path.isdir(os.path.join(evals, last, "greedy", transfer)):
        gain["transfer_greedy"] = compare(os.path.join(evals, first, "greedy", transfer),
                                          os.path.join(evals, last, "greedy", transfer))["difference"]["pass@1"]
    with open(os.path.join(run, "args.json"), encoding="utf-8") as f:
        args = json.load(f)
    sampled_at = None
    if os.path.isdir(os.path.join(evals, last, "n8", task)):
        with open(os.path.join(evals, last, "n8", task, "run.json"), encoding="utf-8") as f:
            sampled_at = json.load(f)["temperature"]
    return {"run": os.path.basename(os.path.normpath(run)), "seed": args["seed"], "points": points, "gain": gain,
            "train_temperature": args.get("temperature"), "eval_sample_temperature": sampled_at}


def plot(seeds: list, task: str, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for seed in seeds:
        pts = [p for p in seed["points"] if p["train_minutes"] is not None]
        x = [p["train_minutes"] for p in pts]
        for key, style in (("greedy", "-o"), ("sampled_pass@1", ":^"), ("sampled_pass@8", "--s")):
            shown = [(t, p[key]) for t, p in zip(x, pts) if key in p]
            if shown:
                ax.errorbar([t for t, _ in shown], [v["mean"] for _, v in shown],
                            yerr=[[v["mean"] - v["low"] for _, v in shown], [v["high"] - v["mean"] for _, v in shown]],
                            fmt=style, capsize=3, label=f"seed {seed['seed']}: {key.replace('greedy', 'greedy pass@1')}")
    ax.set_xlabel("training minutes (generate + score + train)")
    ax.set_ylabel(f"held-out {task}")
    ax.set_ylim(0, 1)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--run", action="append", required=True)
    parser.add_argument("--before", help="the evaluations of the model before SFT (evals/{greedy,n8}/<task>)")
    parser.add_argument("--task", default="chain_sum")
    parser.add_argument("--transfer", default="basic_arithmetic")
    parser.add_argument("--plot", help="also write the plot here (the docs' copy: docs/images/grpo_reasoning.png)")
    parser.add_argument("--note", default="", help="what the result file should say about the run's conditions")
    from benchmarks import record

    record.add_arguments(parser)
    args = parser.parse_args(argv)

    seeds = [seed_curve(run, args.task, args.transfer) for run in args.run]
    when = record.stamp()
    figures = {"task": args.task, "transfer_task": args.transfer, "seeds": seeds, "notes": args.note}
    if args.before:
        figures["before_sft"] = point(args.before, args.task, args.transfer)
    if args.no_save:
        return figures
    path = record.save("grpo_reasoning", figures, results_dir=record.results_dir(args), when=when)
    for target in (path[:-len(".json")] + ".png", args.plot):
        if target:
            plot(seeds, args.task, target)
    for seed in seeds:
        for key in ("greedy", "sampled_pass@1"):
            if key in seed["gain"]:
                g = seed["gain"][key]
                start, end = seed["points"][0][key]["mean"], seed["points"][-1][key]["mean"]
                print(f"seed {seed['seed']}: {key} {start:.3f} -> {end:.3f}, "
                      f"gain {g['mean']:+.3f} [{g['low']:+.3f}, {g['high']:+.3f}]")
    return figures


if __name__ == "__main__":
    main()
