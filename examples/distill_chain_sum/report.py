"""The chain-sum distillation demo's result: held-out pass@1 (greedy) against training minutes for on-policy
distillation, GRPO and SFT on the teacher's answers, each gain over the student with its paired 95% CI, the share
of the teacher's gain each arm reaches and the minutes it needs for 80% of it; a result file and a plot.

    python examples/distill_chain_sum/report.py --distill outputs/smollm2-distill-chain-sum \
        [--distill "LABEL=outputs/other-distill-run" ...] \
        --grpo outputs/smollm2-grpo-chain-sum-s42 --teacher-eval outputs/smollm2-sft-chain-sum-teacher/evals \
        --sft-eval outputs/distill-chain-sum/sft-eval \
        --sft-seconds outputs/distill-chain-sum/sft_arm_seconds.tsv [--note TEXT] [--record | --results-dir DIR]

--distill (one or more; LABEL=DIR names an arm, a bare DIR is "on-policy distillation") and --grpo are run
directories with metrics.jsonl and evals/step-N/greedy/chain_sum (step-0 the student); --teacher-eval and
--sft-eval hold greedy/chain_sum of the teacher and of the SFT arm's model. Minutes are a run's summed generate,
score and train times (the teacher's scoring is inside score). The SFT arm's minutes are the teacher answering the
prompts plus the SFT run (wall).
"""
from __future__ import annotations

import argparse
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from alignment.evaluation.report import compare  # noqa: E402

TASK = "chain_sum"
SHARE = 0.8  # of the teacher's gain



def _reasoning_report():
    """examples/reasoning_demo/report.py, loaded by path (both files are named report.py)."""
    import importlib.util

    path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "reasoning_demo", "report.py")
    spec = importlib.util.spec_from_file_location("reasoning_demo_report", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_REASONING = _reasoning_report()
summary, training_minutes = _REASONING.summary, _REASONING.training_minutes


def run_points(run: str) -> list:
    """[(minutes, step, eval dir)] of a run's evaluations."""
    minutes, evals = training_minutes(run), os.path.join(run, "evals")
    steps = sorted(int(m.group(1)) for m in (re.fullmatch(r"step-(\d+)", d) for d in os.listdir(evals)) if m)
    return [(minutes[step], step, os.path.join(evals, f"step-{step}", "greedy", TASK)) for step in steps]


def labelled(spec: str) -> tuple:
    """'LABEL=DIR' -> (LABEL, DIR); a bare DIR is the on-policy distillation arm."""
    label, named, run = spec.partition("=")
    return (label, run) if named else ("on-policy distillation", spec)


def arm(points: list, start_dir: str, teacher_gain: float) -> dict:
    """Each point's gain over the student (paired 95% CI) and the minutes of the first point at SHARE of the
    teacher's gain."""
    curve, reached = [], None
    for minutes, step, where in points:
        gain = compare(start_dir, where)["difference"]["pass@1"]
        curve.append({"step": step, "minutes": minutes, "gain": gain,
                      "share_of_teacher_gain": gain["mean"] / teacher_gain if teacher_gain else None})
        if reached is None and teacher_gain > 0 and gain["mean"] >= SHARE * teacher_gain:
            reached = minutes
    return {"curve": curve, f"minutes_to_{int(SHARE * 100)}pct_of_teacher_gain": reached}


def plot(arms: dict, path: str, ylabel: str = "held-out greedy pass@1 gain over the student",
         target: float = None) -> None:
    """Each arm's gain against training minutes, with its 95% CI (also examples/curriculum_chain_sum/report.py's);
    `target`: a dashed line at that gain (the share of the teacher's)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for name, result in arms.items():
        c = result["curve"]
        ax.errorbar([p["minutes"] for p in c], [p["gain"]["mean"] for p in c], fmt="-o", capsize=3, label=name,
                    yerr=[[p["gain"]["mean"] - p["gain"]["low"] for p in c], [p["gain"]["high"] - p["gain"]["mean"]
                                                                            for p in c]])
    ax.set_xlabel("training minutes")
    ax.set_ylabel(ylabel)
    ax.axhline(0, color="grey", lw=0.5)
    if target is not None:
        ax.axhline(target, color="black", ls="--", lw=0.8, label=f"{SHARE:.0%} of the teacher's gain")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--distill", required=True, action="append", help="a distillation run: DIR or LABEL=DIR")
    parser.add_argument("--grpo", required=True)
    parser.add_argument("--teacher-eval", required=True, help="the teacher's evaluation directory (greedy/chain_sum)")
    parser.add_argument("--sft-eval", required=True, help="the SFT arm's evaluation directory (greedy/chain_sum)")
    parser.add_argument("--sft-seconds", required=True, help="lines: stage TAB seconds")
    parser.add_argument("--plot", help="also write the plot here")
    parser.add_argument("--note", default="")
    from benchmarks import record

    record.add_arguments(parser)
    args = parser.parse_args(argv)

    grpo = run_points(args.grpo)
    start_dir, teacher_dir = grpo[0][2], os.path.join(args.teacher_eval, "greedy", TASK)
    teacher_gain = compare(start_dir, teacher_dir)["difference"]["pass@1"]
    with open(args.sft_seconds, encoding="utf-8") as f:
        sft_minutes = sum(float(line.split("\t")[1]) for line in f if line.strip()) / 60
    arms = {label: arm(run_points(run), start_dir, teacher_gain["mean"]) for label, run in map(labelled, args.distill)}
    arms.update({"GRPO": arm(grpo, start_dir, teacher_gain["mean"]),
            "SFT on the teacher's answers": arm([(0.0, 0, start_dir),
                                                 (sft_minutes, 1, os.path.join(args.sft_eval, "greedy", TASK))],
                                                start_dir, teacher_gain["mean"])})
    figures = {"task": TASK, "student": summary(start_dir)["pass@1"], "teacher": summary(teacher_dir)["pass@1"],
               "teacher_gain": teacher_gain, "share": SHARE, "arms": arms, "notes": args.note}
    if args.no_save:
        return figures
    path = record.save("distill_chain_sum", figures, results_dir=record.results_dir(args), when=record.stamp())
    for image in (path[:-len(".json")] + ".png", args.plot):
        if image:
            plot(arms, image, target=SHARE * teacher_gain["mean"])
    for name, result in arms.items():
        last = result["curve"][-1]
        reached = result[f"minutes_to_{int(SHARE * 100)}pct_of_teacher_gain"]
        print(f"{name}: gain {last['gain']['mean']:+.3f} [{last['gain']['low']:+.3f}, {last['gain']['high']:+.3f}] "
              f"after {last['minutes']:.1f} min; {SHARE:.0%} of the teacher's gain "
              + ("not reached" if reached is None else f"after {reached:.1f} min"))
    return figures


if __name__ == "__main__":
    main()
