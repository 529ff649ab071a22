"""Per-step instability monitors of the PPO family: small pure checks in a registry, fed the step's metrics and the
run's history; the thresholds are MonitorArguments' keys (alignment/config/monitors.py, docs/trust.md).

A check returns the value that fired it, or None. An event is recorded when a check starts firing (not again
while it keeps firing, so a collapsed entropy gives one event, not one per step); each event is one row of
<output_dir>/monitor_events.jsonl and the step's `monitor/<name>` metric.
"""
from __future__ import annotations

import json
import math
import os
from typing import Callable, Dict, List, Optional

from alignment.config.registry import Registry

MONITORS = Registry("monitor")
EVENTS_FILE = "monitor_events.jsonl"
HELD_OUT_KEYS = ("gold_reward/mean", "eval/gold_reward", "eval/reward")  # the reward-hacking monitor's signal


class History:
    """The rows seen so far: per-step metrics, and evaluations (their eval/* metrics) at the step they ran."""

    def __init__(self):
        self.steps: List[Dict[str, float]] = []  # each with "step"
        self.evaluations: List[Dict[str, float]] = []

    def values(self, key: str, rows: Optional[List[Dict[str, float]]] = None) -> List[float]:
        return [row[key] for row in (self.steps if rows is None else rows) if key in row]

    def held_out(self) -> List[tuple]:
        """[(step, value)] of the first held-out signal the run has (HELD_OUT_KEYS in order)."""
        for key in HELD_OUT_KEYS:
            rows = self.steps if not key.startswith("eval/") else self.evaluations
            points = [(row["step"], row[key]) for row in rows if key in row]
            if points:
                return points
        return []


def mean(values: List[float]) -> float:
    return sum(values) / len(values)


def baseline(history: History, key: str, args) -> Optional[float]:
    """The mean of `key` over the run's first monitor_baseline_steps steps that logged it; None before then."""
    values = history.values(key)
    if len(values) <= args.monitor_baseline_steps:  # the current step must come after the baseline
        return None
    return mean(values[:args.monitor_baseline_steps])


def register(name: str) -> Callable:
    return MONITORS.function(name)


@register("nonfinite")
def nonfinite(metrics, history, args) -> Optional[float]:
    """Any metric NaN or infinite (the optimizer's guard skips such steps; a NaN reward or KL it cannot see)."""
    bad = [v for v in metrics.values() if isinstance(v, float) and not math.isfinite(v)]
    return bad[0] if bad else None


@register("entropy_collapse")
def entropy_collapse(metrics, history, args) -> Optional[float]:
    base = baseline(history, "entropy", args)
    if not args.monitor_entropy_collapse or base is None or "entropy" not in metrics or base <= 0:
        return None
    return metrics["entropy"] if metrics["entropy"] < args.monitor_entropy_collapse * base else None


@register("kl_spike")
def kl_spike(metrics, history, args) -> Optional[float]:
    previous = history.values("kl")[-args.monitor_window - 1:-1]
    # a full window only: a run's first KLs are near 0 (policy == reference), so any growth would look like a spike
    if not args.monitor_kl_spike or "kl" not in metrics or len(previous) < args.monitor_window:
        return None
    kl, before = metrics["kl"], mean(previous)
    return kl if kl > args.monitor_kl_floor and kl > args.monitor_kl_spike * max(before, 0.0) else None


@register("kl_acceleration")
def kl_acceleration(metrics, history, args) -> Optional[float]:
    values = history.values("kl")[-3:]
    if not args.monitor_kl_acceleration or "kl" not in metrics or len(values) < 3 or \
            metrics["kl"] < args.monitor_kl_floor:
        return None
    second = values[2] - 2 * values[1] + values[0]
    return second if second > args.monitor_kl_acceleration else None


@register("length_drift")
def length_drift(metrics, history, args) -> Optional[float]:
    base = baseline(history, "response_length", args)
    if not args.monitor_length_drift or base is None or "response_length" not in metrics or base <= 0:
        return None
    length = metrics["response_length"]
    return length if abs(length - base) > args.monitor_length_drift * base else None


@register("clip_fraction")
def clip_fraction(metrics, history, args) -> Optional[float]:
    value = metrics.get("clip_frac")
    return value if args.monitor_clip_fraction and value is not None and value > args.monitor_clip_fraction else None


@register("zero_variance_groups")
def zero_variance_groups(metrics, history, args) -> Optional[float]:
    value = metrics.get("reward/zero_variance_groups", metrics.get("curriculum/zero_variance_groups"))
    limit = args.monitor_zero_variance_groups
    return value if limit and value is not None and value > limit else None


@register("reward_hacking")
def reward_hacking(metrics, history, args) -> Optional[float]:
    """reward/mean's rise over the window (second half's mean - first half's) when it exceeds the margin while the
    held-out signal of the window's second half is no higher than that of its first half (or, with a sparser
    signal such as evaluations, than its last value before the second half)."""
    window = history.steps[-args.monitor_window:]
    rewards = history.values("reward/mean", window)
    if not args.monitor_reward_hacking or len(window) < args.monitor_window or len(rewards) < args.monitor_window:
        return None
    half = args.monitor_window // 2
    rise = mean(rewards[half:]) - mean(rewards[:half])
    middle, end = window[half]["step"], window[-1]["step"]
    points = history.held_out()
    recent = [v for s, v in points if middle <= s <= end]
    earlier = [v for s, v in points if window[0]["step"] <= s < middle] or [v for s, v in points if s < middle][-1:]
    if rise <= args.monitor_reward_hacking or not recent or not earlier:
        return None
    return rise if mean(recent) <= mean(earlier) else None


class RunMonitors:
    """The registered monitors over one run: `observe` each step's metrics, `evaluated` each evaluation."""

    def __init__(self, args, output_dir: str, writes: bool = True):
        self.args, self.writes = args, writes
        self.path = os.path.join(output_dir, EVENTS_FILE)
        self.history = History()
        self.firing: Dict[str, bool] = {}
        self.events: List[dict] = []

    def evaluated(self, step: int, metrics: Dict[str, float]) -> Dict[str, float]:
        """Record an evaluation's metrics (the reward-hacking monitor's held-out signal); -> them."""
        self.history.evaluations.append({"step": step, **metrics})
        return metrics

    def observe(self, step: int, metrics: Dict[str, float]) -> List[dict]:
        """The events of this step (monitors that start firing); adds `monitor/<name>` (the value) to `metrics`."""
        self.history.steps.append({"step": step, **metrics})
        head, tail = self.args.monitor_baseline_steps, self.args.monitor_window + 3  # all the checks read
        if len(self.history.steps) > 2 * (head + tail):
            self.history.steps = self.history.steps[:head] + self.history.steps[-tail:]
        events = []
        for name in sorted(MONITORS.classes):
            value = MONITORS.classes[name](metrics, self.history, self.args)
            fired, self.firing[name] = value is not None and not self.firing.get(name, False), value is not None
            if fired:
                events.append({"step": step, "monitor": name, "value": float(value)})
        for event in events:
            metrics[f"monitor/{event['monitor']}"] = event["value"]
        self.record(events)
        return events

    def state_dict(self) -> dict:
        return {"steps": self.history.steps, "evaluations": self.history.evaluations[-64:], "firing": self.firing}

    def load_state_dict(self, state: dict) -> None:
        self.history.steps, self.history.evaluations = list(state["steps"]), list(state["evaluations"])
        self.firing = dict(state["firing"])

    def record(self, events: List[dict]) -> None:
        self.events.extend(events)
        if not self.writes or not events:
            return
        os.makedirs(os.path.dirname(self.path) or ".", exist_ok=True)
        with open(self.path, "a", encoding="utf-8") as f:
            f.writelines(json.dumps(event) + "\n" for event in events)

    def start_fresh(self, step: int) -> None:
        """A new run removes an old run's events; a resumed one keeps those of steps <= `step`."""
        if not self.writes or not os.path.exists(self.path):
            return
        kept = [line for line in read_events(self.path) if line["step"] <= step]
        with open(self.path, "w", encoding="utf-8") as f:
            f.writelines(json.dumps(event) + "\n" for event in kept)


def describe(event: dict) -> str:
    return f"monitor {event['monitor']} fired at step {event['step']}: value {event['value']:.4g}"


def read_events(path: str) -> List[dict]:
    """The events of a monitor_events.jsonl ([] without one); a line cut short by a kill is skipped."""
    if not os.path.exists(path):
        return []
    events = []
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            try:
                event = json.loads(line)
            except ValueError:
                continue
            if isinstance(event, dict) and {"step", "monitor", "value"} <= set(event):
                events.append(event)
    return events
