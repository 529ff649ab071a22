"""The speed targets per CPU: one row per CPU model, each figure from that CPU's newest result file that measured
it, beside the target it is held to (the performance issue's list). Nothing here is typed by hand but the targets."""
from __future__ import annotations

from typing import Callable, Dict, List, NamedTuple, Optional

from benchmarks import record
from docsgen.results_tables import rl_smollm2_ratio, small_shape_ratio, smollm2_ratio


class Target(NamedTuple):
    measure: str
    benchmark: str
    at_least: bool  # the figure must be >= bound (a speed-up) or <= bound (a time ratio)
    bound: float
    figure: Callable[[dict, Optional[dict]], Optional[float]]  # (a run's record, its machine) -> figure or None
    percent: bool = False


TARGETS = [
    Target("training step, of the GEMM peak", "machine_limits", True, 0.65,
           lambda r, machine: r.get("train_of_peak"), percent=True),
    Target("training, / transformers", "smollm2", True, 1.2, lambda r, machine: smollm2_ratio(r, "train_step")),
    Target("scoring, / transformers", "smollm2", True, 1.2, lambda r, machine: smollm2_ratio(r, "score")),
    Target("generation, / transformers", "smollm2", True, 1.3, lambda r, machine: smollm2_ratio(r, "generate")),
    Target("PPO step, small shape, / TRL", "ppo", False, 0.5, small_shape_ratio),
    Target("GRPO step, small shape, / TRL", "grpo", False, 0.5, small_shape_ratio),
    Target("PPO step, SmolLM2, / TRL", "rl_smollm2", False, 0.5, lambda r, machine: rl_smollm2_ratio(r, "ppo")),
    Target("GRPO step, SmolLM2, / TRL", "rl_smollm2", False, 0.5, lambda r, machine: rl_smollm2_ratio(r, "grpo")),
]


def _text(value: float, percent: bool, digits: int = 0) -> str:
    return f"{value:.{digits}%}" if percent else f"{value:.{digits + 2}f}x"


def _shown(value: float, percent: bool, digits: int) -> float:
    return float(_text(value, percent, digits).strip("%x")) / (100 if percent else 1)


def _met(target: Target, value: float) -> bool:
    return value >= target.bound if target.at_least else value <= target.bound


def figures(runs: List[record.Run]) -> Dict[str, Dict[str, tuple]]:
    """{cpu: {measure: (figure, run)}}: each measure from the newest run of its benchmark on that CPU with it."""
    table: Dict[str, Dict[str, tuple]] = {}
    for run in sorted(runs, key=lambda run: run.stamp, reverse=True):
        if run.cpu is None or run.record is None:
            continue
        for target in TARGETS:
            if run.benchmark == target.benchmark and target.measure not in table.get(run.cpu, {}):
                value = target.figure(run.record, run.machine)
                if value is not None:
                    table.setdefault(run.cpu, {})[target.measure] = (value, run)
    return table


def cell(target: Target, found: Optional[tuple]) -> str:
    if found is None:
        return "-"
    value, digits = found[0], 0
    while digits < 4 and _met(target, _shown(value, target.percent, digits)) != _met(target, value):
        digits += 1  # a digit more where rounding would hide that the figure falls short
    return f"**{_text(value, target.percent, digits)}**" + ("" if _met(target, value) else " (not met)")


def targets_table() -> str:
    """Markdown: the targets' row, then a row per CPU (newest measurement first) with the runs it comes from."""
    table = figures(record.runs())
    header = ["CPU"] + [t.measure for t in TARGETS] + ["newest of its runs"]
    bounds = ["target"] + [("&ge; " if t.at_least else "&le; ") + _text(t.bound, t.percent) for t in TARGETS] + [""]
    lines = ["| " + " | ".join(header) + " |", "| " + " | ".join("---" for _ in header) + " |",
             "| " + " | ".join(bounds) + " |"]
    newest = {cpu: max((run for _, run in found.values()), key=lambda run: run.stamp) for cpu, found in table.items()}
    for cpu in sorted(table, key=lambda cpu: newest[cpu].stamp, reverse=True):
        last = newest[cpu]
        lines.append("| " + " | ".join([cpu] + [cell(t, table[cpu].get(t.measure)) for t in TARGETS]
                                       + [f"{last.date}, `{last.commit}`"]) + " |")
    return "\n".join(lines)
