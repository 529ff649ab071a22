"""Reward over-optimisation, as Gao et al. (2022) plot it: proxy reward (the trained reward model) and gold reward
(the offline judge) against the square root of the KL to the reference policy, for one run or a sweep of runs.

    python tools/plot_overoptimization.py outputs/smollm2-ppo [more run dirs ...] [--output curve.png]

Reads each run's metrics.jsonl (`kl`: the per-response KL to the reference, batch mean; `reward/mean`;
`gold_reward/mean`) and args.json (its `kl_coeff` labels the curves). Points are running means over `--smooth`
steps (per-step values from a few prompts are noisy). A run's evaluations (`eval/reward`, `eval/gold_reward`) are
drawn as dots at the KL its policy had reached (step 0: the reference itself). Prints, per run, where the gold
reward peaked and where the run ended: the proxy still rising while the gold falls is over-optimisation.
"""
from __future__ import annotations

import math
import os
import sys
from typing import Dict, List

from alignment.commands.tool_parser import ToolParser, positive_int
from alignment.fileio import refuse_to_replace
from alignment.inputs import read_json_object

from alignment.training.logger import read_series


def running_mean(values: List[float], window: int) -> List[float]:
    out = []
    for i in range(len(values)):
        part = values[max(0, i - window + 1): i + 1]
        out.append(sum(part) / len(part))
    return out


def curve(run_dir: str, smooth: int) -> Dict[str, object]:
    """{'label', 'sqrt_kl', 'proxy', 'gold'} of one run (smoothed, in step order); ValueError when it lacks a metric."""
    series = read_series(os.path.join(run_dir, "metrics.jsonl"))
    missing = [k for k in ("kl", "reward/mean", "gold_reward/mean") if k not in series]
    if missing:
        raise ValueError(f"{run_dir}: metrics.jsonl has no {', '.join(missing)} (a PPO/GRPO run with a gold_judge)")
    steps = sorted(set(s for s, _ in series["kl"]) & set(s for s, _ in series["reward/mean"])
                   & set(s for s, _ in series["gold_reward/mean"]))
    at = {key: dict(series[key]) for key in ("kl", "reward/mean", "gold_reward/mean")}
    kl = running_mean([max(at["kl"][s], 0.0) for s in steps], smooth)  # k1 estimates can dip below 0
    label = os.path.basename(os.path.normpath(run_dir))
    args_file = os.path.join(run_dir, "args.json")
    if os.path.exists(args_file):
        label += f" (kl_coeff {read_json_object(args_file, 'argument record').get('kl_coeff', '?')})"
    sqrt_kl = [math.sqrt(v) for v in kl]
    held_out = []  # (sqrt KL of the policy evaluated, held-out proxy, held-out gold); step 0 is the reference itself
    if "eval/reward" in series and "eval/gold_reward" in series:
        gold_at = dict(series["eval/gold_reward"])
        for step, proxy in series["eval/reward"]:
            if step in gold_at:
                done = [i for i, s in enumerate(steps) if s <= step]
                held_out.append((sqrt_kl[done[-1]] if step > 0 and done else 0.0, proxy, gold_at[step]))
    return {"label": label, "steps": steps, "sqrt_kl": sqrt_kl, "held_out": held_out,
            "proxy": running_mean([at["reward/mean"][s] for s in steps], smooth),
            "gold": running_mean([at["gold_reward/mean"][s] for s in steps], smooth)}


def summary(c: Dict[str, object]) -> str:
    best = max(range(len(c["gold"])), key=lambda i: c["gold"][i])
    text = (f"{c['label']}: gold peaked at {c['gold'][best]:.3f} (step {c['steps'][best]}, sqrt KL "
            f"{c['sqrt_kl'][best]:.3f}); ended at sqrt KL {c['sqrt_kl'][-1]:.3f} with proxy {c['proxy'][-1]:.3f}, "
            f"gold {c['gold'][-1]:.3f}")
    if len(c["held_out"]) >= 2:
        (_, proxy_0, gold_0), (_, proxy_1, gold_1) = c["held_out"][0], c["held_out"][-1]
        text += f"; held-out proxy {proxy_0:.3f} -> {proxy_1:.3f}, gold {gold_0:.3f} -> {gold_1:.3f}"
    return text


def plot(curves: List[Dict[str, object]], output: str) -> str:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    # two panels on one sqrt(KL) axis: the reward model's scale is its own, so proxy and gold get their own y-axes
    fig, (proxy_ax, gold_ax) = plt.subplots(1, 2, figsize=(10, 4.2), sharex=True)
    for index, c in enumerate(curves):
        proxy_ax.plot(c["sqrt_kl"], c["proxy"], "-", color=f"C{index}", label=c["label"])
        gold_ax.plot(c["sqrt_kl"], c["gold"], "--", color=f"C{index}", label=c["label"])
        if c["held_out"]:
            x, proxy, gold = zip(*c["held_out"])
            proxy_ax.plot(x, proxy, "o", color=f"C{index}", markersize=6)
            gold_ax.plot(x, gold, "o", color=f"C{index}", markersize=6)
    for ax, title in ((proxy_ax, "proxy reward (the reward model)"), (gold_ax, "gold reward (the judge)")):
        ax.set_xlabel("sqrt(KL to the reference policy)")
        ax.set_title(title)
        ax.grid(alpha=0.3)
    proxy_ax.set_ylabel("reward")
    fig.suptitle("lines: training batches (running mean over steps); dots: held-out evaluation", fontsize=9)
    gold_ax.legend(fontsize=7)
    fig.tight_layout()
    tmp = output + ".tmp.png"
    fig.savefig(tmp, dpi=90)
    plt.close(fig)
    os.replace(tmp, output)
    return output


def main(argv=None) -> str:
    parser = ToolParser(__doc__)
    parser.add_argument("runs", nargs="+", help="output_dirs of PPO/GRPO runs with a gold_judge")
    parser.add_argument("--output", default=None, help="PNG path (default: <first run>/overoptimization.png)")
    parser.add_argument("--smooth", type=positive_int, default=3, help="running-mean window in steps")
    parser.add_argument("--overwrite", action="store_true", help="replace an existing --output")
    args = parser.parse_args(argv)
    try:
        if args.output:
            refuse_to_replace(args.output, args.overwrite)
        curves = [curve(run, max(1, args.smooth)) for run in args.runs]
    except (OSError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        raise SystemExit(2)
    for c in curves:
        print(summary(c))
    path = plot(curves, args.output or os.path.join(args.runs[0], "overoptimization.png"))
    print(f"over-optimisation curve: {path}")
    return path

