"""The main demo's PPO-vs-DPO verdict over training seeds: each arm's held-out gold reward (the `dialogue_gold` task
of alignment-eval: the quickstart's 40 held-out prompts, greedy, the `combined` judge) per seed with its 95% CI over
prompts, each arm over its seeds with a two-level bootstrap (seeds, then prompts), and DPO - PPO with the same
bootstrap paired by prompt; a result file (CPU, date, commit).

    python examples/main_demo_seeds/report.py --start outputs/main-demo-seeds/sft \
        --arm PPO outputs/main-demo-seeds/ppo-s42 outputs/main-demo-seeds/ppo-s1 ... --arm DPO ... [--note TEXT] \
        [--record | --results-dir DIR]

Each directory is one `alignment-eval --task dialogue_gold` output (its run.json and items.jsonl); the seed of a run
is read from the `args.json` of the policy it evaluated.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, REPO)

from alignment.evaluation.metrics import bootstrap_ci, seeds_and_items_ci, seeds_and_items_difference_ci  # noqa
from alignment.evaluation.report import load_run  # noqa: E402

METRIC = "mean@1"


def _interval(triple) -> dict:
    return dict(zip(("mean", "low", "high"), triple))


def run_scores(eval_dir: str) -> tuple:
    """(per-prompt gold rewards ordered by item index, the training seed or None, the policy path)."""
    run = load_run(eval_dir)
    scores = [row["metrics"][METRIC] for row in sorted(run["items"], key=lambda row: row["index"])]
    policy = run["settings"]["policy"]
    seed = None
    for args_dir in (policy, os.path.dirname(os.path.normpath(policy))):  # a stage's model/ or an RL run's policy/
        path = os.path.join(args_dir, "args.json")
        if os.path.isfile(path):
            with open(path, encoding="utf-8") as f:
                seed = json.load(f).get("seed")
            break
    inside = os.path.abspath(policy).startswith(REPO + os.sep)  # the checkout's own paths, not this machine's
    return scores, seed, os.path.relpath(policy, REPO) if inside else policy


def arm(name: str, eval_dirs: list) -> dict:
    runs = [run_scores(d) for d in eval_dirs]
    scores = [scores for scores, _, _ in runs]
    if len({len(s) for s in scores}) != 1:
        raise SystemExit(f"error: arm {name}: the evaluations cover different numbers of prompts")
    return {"arm": name, "scores": scores,
            "runs": [{"seed": seed, "policy": policy, "gold": _interval(bootstrap_ci(s))}
                     for s, seed, policy in runs],
            "over_seeds": _interval(seeds_and_items_ci(scores))}


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--start", required=True, help="the evaluation of the policy both arms start from (SFT)")
    parser.add_argument("--arm", nargs="+", action="append", required=True, metavar=("NAME", "EVAL_DIR"),
                        help="an arm's name, then one evaluation directory per training seed")
    parser.add_argument("--note", default="", help="what the result file should say about the runs' conditions")
    from benchmarks import record

    record.add_arguments(parser)
    args = parser.parse_args(argv)
    if any(len(given) < 2 for given in args.arm):
        parser.error("--arm takes a name and at least one evaluation directory")

    start_scores, _, start_policy = run_scores(args.start)
    arms = [arm(given[0], given[1:]) for given in args.arm]
    differences = []
    for i, a in enumerate(arms):
        for b in arms[i + 1:]:
            diff = _interval(seeds_and_items_difference_ci(a["scores"], b["scores"]))
            differences.append({"arms": f"{b['arm']} - {a['arm']}", **diff,
                                "intervals_overlap": not (a["over_seeds"]["high"] < b["over_seeds"]["low"]
                                                          or b["over_seeds"]["high"] < a["over_seeds"]["low"])})
    figures = {"task": "dialogue_gold", "metric": f"greedy gold reward ({METRIC})", "prompts": len(start_scores),
               "start": {"policy": start_policy, "gold": _interval(bootstrap_ci(start_scores))},
               "arms": [{k: v for k, v in a.items() if k != "scores"} for a in arms], "differences": differences,
               "notes": args.note}
    for a in figures["arms"]:
        o = a["over_seeds"]
        print(f"{a['arm']}: {o['mean']:.4f} [{o['low']:.4f}, {o['high']:.4f}] over seeds "
              f"{[r['seed'] for r in a['runs']]}: " + ", ".join(f"{r['gold']['mean']:.4f}" for r in a["runs"]))
    for d in differences:
        print(f"{d['arms']}: {d['mean']:+.4f} [{d['low']:+.4f}, {d['high']:+.4f}]"
              f"{' (the arms overlap)' if d['intervals_overlap'] else ''}")
    if not args.no_save:
        record.save("main_demo_seeds", figures, results_dir=record.results_dir(args), when=record.stamp())
    return figures


if __name__ == "__main__":
    main()
