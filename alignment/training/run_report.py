"""A run's report: report.md (final / min / max of every metric by family, the monitors' events, the plots) and one
SVG page per family (rewards, KL, entropy, lengths, evaluation, timings) with the events marked.

The PPO family writes it at the end of every run (and when monitor_action stop ends one); `python tools/report.py
RUN` (alignment/commands/report.py) writes it again for any run directory holding metrics.jsonl (and
monitor_events.jsonl, when monitors fired).
"""
from __future__ import annotations

import os
from typing import Dict, List, Tuple

from alignment.fileio import write_text_atomic
from alignment.training.logger import read_series
from alignment.training.monitors import EVENTS_FILE, describe, read_events
from alignment.training.svg_chart import chart_svg

# (family, whether it is plotted, whether a metric belongs to it); the first that matches takes a metric
FAMILIES: List[Tuple[str, bool, object]] = [
    ("evaluation", True, lambda key: key.startswith("eval/")),
    ("monitors", False, lambda key: key.startswith("monitor/")),
    ("timings", True, lambda key: key.startswith("time/")),
    ("rewards", True, lambda key: "reward" in key),
    ("kl", True, lambda key: "kl" in key),
    ("entropy", True, lambda key: "entropy" in key),
    ("lengths", True, lambda key: "length" in key or key == "truncated"),
    ("training", False, lambda key: True),
]
MAX_PANELS = 6  # per page: the family's first metrics (the table lists them all)
LEFT_OUT = ("time/step_start",)  # a clock reading, not a quantity


def family_of(key: str) -> str:
    return next(name for name, _, belongs in FAMILIES if belongs(key))


def grouped(series: Dict[str, list]) -> Dict[str, List[str]]:
    """{family: its metrics} in FAMILIES order, families without metrics left out."""
    groups: Dict[str, List[str]] = {name: [] for name, _, _ in FAMILIES}
    for key in (key for key in series if key not in LEFT_OUT):
        groups[family_of(key)].append(key)
    return {name: keys for name, keys in groups.items() if keys}


def plot_family(path: str, family: str, keys: List[str], series: Dict[str, list], events: List[dict]) -> None:
    """The family's SVG page (alignment/training/svg_chart.py): its first MAX_PANELS metrics, each event a red dashed
    line at its step."""
    marks = [(event["step"], str(event["monitor"])) for event in events
             if isinstance(event["step"], (int, float)) and not isinstance(event["step"], bool)]
    write_text_atomic(path, chart_svg(family, [(key, series[key]) for key in keys[:MAX_PANELS]], marks))


def number(value: float) -> str:
    return f"{value:.4g}"


def report_text(run: str, groups: Dict[str, List[str]], series: Dict[str, list], events: List[dict],
                plots: List[str]) -> str:
    lines = [f"# Run report: {os.path.basename(os.path.normpath(run))}", "",
             "## Monitor events", ""]
    lines += [f"- {describe(event)}" for event in events] or ["None: no monitor fired."]
    lines += ["", "## Metrics", "", "| family | metric | steps | final | min | max |", "|---|---|---|---|---|---|"]
    for family, keys in groups.items():
        for key in keys:
            values = [v for _, v in series[key]]
            lines.append(f"| {family} | `{key}` | {len(values)} | {number(values[-1])} | {number(min(values))} | "
                         f"{number(max(values))} |")
    if plots:
        lines += ["", "## Plots", "", "Monitor events are the red dashed lines.", ""]
        lines += [f"![{os.path.splitext(name)[0]}]({name})" for name in plots]
    return "\n".join(lines) + "\n"


def write_report(run: str) -> str:
    """Write <run>/report.md and its SVG pages from <run>/metrics.jsonl and <run>/monitor_events.jsonl; -> its path."""
    metrics = os.path.join(run, "metrics.jsonl")
    if not os.path.exists(metrics):
        raise FileNotFoundError(f"{metrics}: no such file (is {run} a run's output_dir?)")
    series = read_series(metrics)
    events = read_events(os.path.join(run, EVENTS_FILE))
    groups, plots = grouped(series), []
    plotted = {name for name, plot, _ in FAMILIES if plot}
    for family, keys in groups.items():
        if family in plotted:
            name = f"report_{family}.svg"
            plot_family(os.path.join(run, name), family, keys, series, events)
            plots.append(name)
    path = os.path.join(run, "report.md")
    write_text_atomic(path, report_text(run, groups, series, events, plots))
    return path
