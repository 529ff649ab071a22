"""Draw a run's curves from its metrics.jsonl into one PNG, and print each curve's trend in words.

    python tools/plot_run.py outputs/smollm2-ppo [--output report.png]

Works for every stage's output directory: panels appear for the metrics the run logged (reward, gold reward,
KL, losses, response length, accuracies, DPO implicit rewards); train rows are lines, eval rows are dots.
Writes <output_dir>/run_report.png unless --output is given.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Dict, List, Tuple

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


def read_series(path: str) -> Dict[str, List[Tuple[int, float]]]:
    """{metric: [(step, value), ...]} for the numeric metrics of a metrics.jsonl file."""
    series: Dict[str, List[Tuple[int, float]]] = {}
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as err:
                raise ValueError(f"{path} line {number}: not JSON ({err.msg})") from None
            for key, value in row.items():
                if key != "step" and isinstance(value, (int, float)):
                    series.setdefault(key, []).append((row["step"], float(value)))
    return series


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


def plot_run(output_dir: str, output: str = None) -> Tuple[str, List[str]]:
    """Write the PNG; return its path and one line per plotted curve."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    metrics = os.path.join(output_dir, "metrics.jsonl")
    if not os.path.exists(metrics):
        raise FileNotFoundError(f"{metrics}: no such file (is {output_dir} a run's output_dir?)")
    series = read_series(metrics)
    panels = [(title, [k for k in keys if k in series]) for title, keys in PANELS]
    panels = [(title, keys) for title, keys in panels if keys]
    if not panels:
        raise ValueError(f"{metrics}: none of the plotted metrics were logged")
    columns = 2 if len(panels) > 1 else 1
    rows = (len(panels) + columns - 1) // columns
    fig, axes = plt.subplots(rows, columns, figsize=(6 * columns, 3.2 * rows), squeeze=False)
    lines = []
    for ax, (title, keys) in zip(axes.flat, panels):
        for key in keys:
            steps, values = zip(*series[key])
            if key.startswith("eval/"):
                ax.plot(steps, values, "o--", label=key)
            else:
                ax.plot(steps, values, "-", label=key)
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
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("output_dir", help="a run's output_dir (holding metrics.jsonl)")
    p.add_argument("--output", default=None, help="PNG path (default: <output_dir>/run_report.png)")
    args = p.parse_args(argv)
    try:
        path, lines = plot_run(args.output_dir, args.output)
    except (FileNotFoundError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        raise SystemExit(2)
    print("\n".join(lines))
    print(f"run report: {path}")
    return path


if __name__ == "__main__":
    main()
