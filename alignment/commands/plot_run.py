"""Draw a run's curves from its metrics.jsonl into one PNG, and print each curve's trend in words.

    python tools/plot_run.py outputs/smollm2-ppo [--output report.png]

Works for every stage's output directory: panels appear for the metrics the run logged (reward, gold reward,
KL, losses, response length, accuracies, DPO implicit rewards), one quantity per panel; per-step values are a
faint line with an exponentially smoothed one over it, evaluations are points.
Writes <output_dir>/run_report.png unless --output is given.
"""
from __future__ import annotations

import os
import sys
from typing import Dict, List, Tuple

from alignment.commands.tool_parser import ToolParser
from alignment.fileio import refuse_to_replace

from alignment.training.logger import read_series

PANELS: List[Tuple[str, List[str]]] = [
    ("reward (proxy)", ["reward/mean", "eval/reward"]),
    ("gold reward (judge)", ["gold_reward/mean", "eval/gold_reward"]),
    # one scale per panel: the summed per-response KL and the per-token approx_kl, or a policy loss of ~0.02 and a
    # value loss of ~2, drawn on one axis, would leave the smaller flat
    ("KL to reference (summed over the response)", ["kl"]),
    ("policy change per token (approx_kl)", ["approx_kl"]),
    ("loss", ["loss", "eval/loss"]),
    ("actor loss", ["actor_loss"]),
    ("critic loss", ["critic_loss"]),
    ("response length (tokens)", ["response_length", "eval/response_length"]),
    ("accuracy", ["accuracy", "eval/accuracy", "rewards/accuracy", "eval/rewards/accuracy"]),
    ("implicit reward margin", ["rewards/margin", "eval/rewards/margin"]),
]


def trend(points: List[Tuple[int, float]]) -> str:
    """First -> last value; with 8 or more points, the means of the first and last quarters (per-step values
    from a few prompts are noisy)."""
    values = [v for _, v in points]
    span = len(values) // 4 if len(values) >= 8 else 1
    first, last = sum(values[:span]) / span, sum(values[-span:]) / span
    direction = "rose" if last > first else "fell" if last < first else "stayed flat"
    what = f"mean of first/last {span} points" if span > 1 else "first/last point"
    return (f"{direction} {first:.4g} -> {last:.4g} ({what}; steps {points[0][0]}-{points[-1][0]}, "
            f"range {min(values):.4g} .. {max(values):.4g})")


def smoothed(values: List[float], weight: float) -> List[float]:
    """Exponential moving average with TensorBoard's debiasing (the first points are not pulled toward 0):
    s_t = weight * s_{t-1} + (1 - weight) * v_t, divided by 1 - weight ** t."""
    out, average = [], 0.0
    for t, value in enumerate(values, 1):
        average = weight * average + (1 - weight) * value
        out.append(average / (1 - weight ** t))
    return out


def smoothing_weight(points: int) -> float:
    """Stronger smoothing for longer runs: about a tenth of the run (0 below 5 points: nothing to smooth)."""
    if points < 5:
        return 0.0
    return 0.5 if points <= 20 else min(0.9, 1 - 10 / points)


def panels_for(series: Dict[str, list]) -> List[Tuple[str, List[str]]]:
    """The (title, metrics) panels that a run with these metrics gets: one quantity (scale) per panel."""
    panels = [(title, [k for k in keys if k in series]) for title, keys in PANELS]
    return [(title, keys) for title, keys in panels if keys]


def plot_run(output_dir: str, output: str = None) -> Tuple[str, List[str]]:
    """Write the PNG; return its path and one line per plotted curve."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    metrics = os.path.join(output_dir, "metrics.jsonl")
    if not os.path.exists(metrics):
        raise FileNotFoundError(f"{metrics}: no such file (is {output_dir} a run's output_dir?)")
    series = read_series(metrics)
    panels = panels_for(series)
    if not panels:
        raise ValueError(f"{metrics}: none of the plotted metrics were logged")
    columns = 2 if len(panels) > 1 else 1
    rows = (len(panels) + columns - 1) // columns
    fig, axes = plt.subplots(rows, columns, figsize=(6 * columns, 3.2 * rows), squeeze=False)
    lines = []
    for ax, (title, keys) in zip(axes.flat, panels):
        for key in keys:
            steps, values = zip(*series[key])
            if key.startswith("eval/"):  # a few evaluations: points, not a line
                ax.plot(steps, values, "o", markersize=6, label=key)
            else:  # per-step values are noisy: the raw line faint, a smoothed one over it
                weight = smoothing_weight(len(values))
                raw = ax.plot(steps, values, "-", alpha=0.3 if weight else 1.0, linewidth=1,
                              label=key if not weight else None)[0]
                if weight:
                    ax.plot(steps, smoothed(list(values), weight), "-", color=raw.get_color(), linewidth=2,
                            label=f"{key} (smoothed {weight:.2f})")
            lines.append(f"{key}: {trend(series[key])}")
        ax.set_title(title)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    for ax in list(axes.flat)[len(panels):]:
        ax.axis("off")
    fig.suptitle(os.path.basename(os.path.normpath(output_dir)))
    fig.tight_layout()
    output = output or os.path.join(output_dir, "run_report.png")
    tmp = output + ".tmp.png"
    fig.savefig(tmp, dpi=90)
    plt.close(fig)
    os.replace(tmp, output)
    return output, lines


def main(argv=None) -> str:
    p = ToolParser(__doc__)
    p.add_argument("output_dir", help="a run's output_dir (holding metrics.jsonl)")
    p.add_argument("--output", default=None, help="PNG path (default: <output_dir>/run_report.png, replaced)")
    p.add_argument("--overwrite", action="store_true", help="replace an existing --output")
    args = p.parse_args(argv)
    try:
        if args.output:
            refuse_to_replace(args.output, args.overwrite)
        path, lines = plot_run(args.output_dir, args.output)
    except (FileNotFoundError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        raise SystemExit(2)
    print("\n".join(lines))
    print(f"run report: {path}")
    return path

