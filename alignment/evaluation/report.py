"""An evaluation's summary as result files (summary.json with the header every result carries: CPU, date,
commit, command; summary.md, a table) and `compare`: the paired bootstrap of two runs over the same items."""
from __future__ import annotations

import json
import os
from typing import Any, Dict, List

from alignment.evaluation.metrics import paired_bootstrap
from alignment.evaluation.runner import ITEMS, SETTINGS
from alignment.fileio import write_json_atomic, write_text_atomic
from alignment.inputs import InputError


def table(summary: Dict[str, Dict[str, float]]) -> str:
    rows = [f"| {name} | {v['mean']:.4f} | [{v['low']:.4f}, {v['high']:.4f}] |" for name, v in summary.items()]
    return "\n".join(["| metric | mean | 95% CI |", "| --- | ---: | --- |", *rows])


def write_summary(out_dir: str, result: Dict[str, Any]) -> Dict[str, Any]:
    from alignment.cpu_env import describe_machine
    from alignment.provenance import result_header

    record = {**result_header("evaluation"), "settings": result["settings"], "items": len(result["items"]),
              "summary": result["summary"]}
    write_json_atomic(os.path.join(out_dir, "summary.json"), record, indent=1)
    s = result["settings"]
    lines = [f"# {s['task']}: {len(result['items'])} items x {s['n']} samples "
             f"(temperature {s['temperature']}, seed {s['seed']})", "",
             f"Policy: `{s.get('policy')}`; {describe_machine(record['machine'])}; {record['date']}, "
             f"commit `{record['commit']}`.", "", table(result["summary"]), ""]
    write_text_atomic(os.path.join(out_dir, "summary.md"), "\n".join(lines))
    return record


def load_run(out_dir: str) -> Dict[str, Any]:
    """A finished evaluation directory's settings and per-item records."""
    path = os.path.join(out_dir, SETTINGS)
    if not os.path.isfile(path):
        raise InputError(f"{out_dir}: not an evaluation directory (no {SETTINGS})")
    with open(path, encoding="utf-8") as f:
        settings = json.load(f)
    with open(os.path.join(out_dir, ITEMS), encoding="utf-8") as f:
        items = [json.loads(line) for line in f if line.endswith("\n")]
    return {"settings": settings, "items": items}


def compare(dir_a: str, dir_b: str, seed: int = 0) -> Dict[str, Any]:
    """{"items": count, "difference": {metric: {mean, low, high}}}: B - A over the items both runs evaluated
    (paired by item index); runs of different tasks or rows are an InputError."""
    a, b = load_run(dir_a), load_run(dir_b)
    if a["settings"]["rows_sha256"] != b["settings"]["rows_sha256"]:
        raise InputError(f"--compare {dir_a} {dir_b}: the runs evaluated different items (task "
                         f"{a['settings']['task']!r} vs {b['settings']['task']!r})")
    items_a = {r["index"]: r["metrics"] for r in a["items"]}
    items_b = {r["index"]: r["metrics"] for r in b["items"]}
    common = sorted(set(items_a) & set(items_b))
    if not common:
        raise InputError(f"--compare {dir_a} {dir_b}: no item evaluated in both")
    metrics: List[str] = [m for m in items_a[common[0]] if m in items_b[common[0]]]
    return {"items": len(common),
            "difference": {m: dict(zip(("mean", "low", "high"), paired_bootstrap(
                [items_a[i][m] for i in common], [items_b[i][m] for i in common], seed))) for m in metrics}}
