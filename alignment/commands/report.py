"""A run's report: report.md (final / min / max of every metric by family, the monitors' events, the plots) and one
SVG page per family (rewards, KL, entropy, lengths, evaluation, timings) with the events marked
(alignment/training/run_report.py).

    python tools/report.py outputs/tiny-grpo

The PPO family writes it at the end of every run (and when monitor_action stop ends one); this command writes it
again for any run directory holding metrics.jsonl (and monitor_events.jsonl, when monitors fired).
"""
from __future__ import annotations

import sys

from alignment.commands.tool_parser import ToolParser
from alignment.training.run_report import write_report


def main(argv=None) -> str:
    p = ToolParser(__doc__)
    p.add_argument("run", help="a run's output_dir (holding metrics.jsonl)")
    args = p.parse_args(argv)
    try:
        path = write_report(args.run)
    except (FileNotFoundError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        raise SystemExit(2)
    print(f"run report: {path}")
    return path
