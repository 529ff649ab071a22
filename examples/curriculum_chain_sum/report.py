"""The curriculum's measurement: held-out pass@1 (8 samples) against training minutes for GRPO with and without
`curriculum: true` on the same small prompt pool, each gain over the start with its paired 95% CI, the minutes each
arm needs to reach the plain arm's final gain, the curriculum's final difference from the plain arm (paired 95% CI),
and the fraction of zero-variance groups per quarter of each run; a result file and a plot.

    python examples/curriculum_chain_sum/report.py --plain outputs/smollm2-grpo-chain-sum-pool-plain-s42 \
        --curriculum outputs/smollm2-grpo-chain-sum-pool-curriculum-s42 [--note TEXT] [--record | --results-dir DIR]

Each run directory holds metrics.jsonl and evals/step-N/n8/chain_sum (step-0 is the model both start from), as
examples/curriculum_chain_sum.sh writes them. Minutes are a run's summed generate, score and train times.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from alignment.evaluation.report import compare  # noqa: E402

TASK, METRIC = "chain_sum", "pass@1"


def _example_report(folder: str):
    """examples/<folder>/report.py, loaded by path (every demo's report is named report.py)."""
    path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), folder, "report.py")
    spec = importlib.util.spec_from_file_location(f"{folder}_report", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_distill = _example_report("distill_chain_sum")
_reasoning = _distill._REASONING  # examples/reasoning_demo/report.py, which the distillation report loaded


def evals(run: str) -> list:
    """[(step, minutes, eval dir)] of a run's evaluations, step 0 first."""
    minutes, where = _reasoning.training_minutes(run), os.path.join(run, "evals")
    steps = sorted(int(m.group(1)) for m in (re.fullmatch(r"step-(\d+)", d) for d in os.listdir(where)) if m)
    return [(step, minutes[step], os.path.join(where, f"step-{step}", "n8", TASK)) for step in steps]


def zero_variance_by_quarter(run: str) -> list:
    """The mean fraction of a step's groups with equal rewards, over each quarter of the run's steps."""
    with open(os.path.join(run, "metrics.jsonl"), encoding="utf-8") as f:
        rows = [r for r in map(json.loads, f) if "time/train" in r]
    values = [r.get("curriculum/zero_variance_groups", r.get("reward/zero_variance_groups")) for r in rows]
    quarter = max(1, len(values) // 4)
    return [sum(values[i:i + quarter]) / len(values[i:i + quarter]) for i in range(0, len(values), quarter)][:4]


def arm(run: str, target: float = None) -> dict:
    points = evals(run)
    start = points[0][2]
    curve = [{"step": step, "minutes": minutes, METRIC: _reasoning.summary(where)[METRIC],
              "gain": compare(start, where)["difference"][METRIC]} for step, minutes, where in points]
    with open(os.path.join(run, "metrics.jsonl"), encoding="utf-8") as f:
        last = [r for r in map(json.loads, f) if "time/train" in r][-1]
    return {"run": os.path.basename(os.path.normpath(run)), "curve": curve,
            "zero_variance_groups_by_quarter": zero_variance_by_quarter(run),
            "pool_at_end": {k: last[k] for k in ("curriculum/pool", "curriculum/set_aside", "curriculum/readmissions")
                            if k in last}}


def first_reaching(curve: list, target: float):
    """The first evaluation (after the start) whose gain reaches target, or None."""
    return next((p for p in curve if p["step"] > 0 and p["gain"]["mean"] >= target), None)


def median_step_seconds(run: str) -> float:
    with open(os.path.join(run, "metrics.jsonl"), encoding="utf-8") as f:
        times = sorted(sum(r.get(k, 0.0) for k in ("time/generate", "time/score", "time/train"))
                       for r in map(json.loads, f) if "time/train" in r)
    return times[len(times) // 2]


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--plain", required=True)
    parser.add_argument("--curriculum", required=True)
    parser.add_argument("--plot", help="also write the plot here")
    parser.add_argument("--note", default="")
    from benchmarks import record

    record.add_arguments(parser)
    args = parser.parse_args(argv)

    arms = {"plain": arm(args.plain), "curriculum": arm(args.curriculum)}
    target = arms["plain"]["curve"][-1]["gain"]["mean"]
    for (name, result), run in zip(arms.items(), (args.plain, args.curriculum)):
        reached = first_reaching(result["curve"], target)
        result["steps_to_plain_final_gain"] = reached and reached["step"]
        result["minutes_to_plain_final_gain"] = reached and reached["minutes"]
        result["median_step_seconds"] = median_step_seconds(run)
    final = compare(evals(args.plain)[-1][2], evals(args.curriculum)[-1][2])["difference"][METRIC]
    figures = {"task": TASK, "metric": f"sampled {METRIC} (8 samples, first 100 items)", "target_gain": target,
               "arms": arms, "curriculum_minus_plain_at_end": final, "notes": args.note}
    if args.no_save:
        return figures
    path = record.save("curriculum_chain_sum", figures, results_dir=record.results_dir(args), when=record.stamp())
    for out in (path[:-len(".json")] + ".png", args.plot):
        if out:
            _distill.plot(arms, out, ylabel=f"held-out {TASK} sampled {METRIC} gain")
    for name, result in arms.items():
        g, minutes = result["curve"][-1]["gain"], result["minutes_to_plain_final_gain"]
        minutes = "-" if minutes is None else f"{minutes:.1f}"
        print(f"{name}: gain {g['mean']:+.3f} [{g['low']:+.3f}, {g['high']:+.3f}] after "
              f"{result['curve'][-1]['minutes']:.1f} min ({result['median_step_seconds']:.1f} s a step); plain's "
              f"final gain after step {result['steps_to_plain_final_gain']} ({minutes} min)"
              "; zero-variance groups by quarter "
              + ", ".join(f"{v:.2f}" for v in result["zero_variance_groups_by_quarter"]))
    print(f"curriculum - plain at the end: {final['mean']:+.3f} [{final['low']:+.3f}, {final['high']:+.3f}]")
    return figures


if __name__ == "__main__":
    main()
