"""Run logs, the same for every stage: `metrics.jsonl` (one JSON object per logged step), VisualDL, console."""
from __future__ import annotations

import json
import math
import os
from typing import Dict


def _format(value) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


class MetricsLogger:
    def __init__(self, output_dir: str, enabled: bool = True, use_visualdl: bool = True):
        """`enabled` is False on non-zero ranks: only rank 0 writes."""
        self.enabled = enabled
        self.path = os.path.join(output_dir, "metrics.jsonl")
        self._writer = None
        if enabled:
            os.makedirs(output_dir, exist_ok=True)
            self._file = open(self.path, "a", encoding="utf-8")
            if use_visualdl:
                from visualdl import LogWriter

                self._writer = LogWriter(logdir=os.path.join(output_dir, "visualdl"))

    def log(self, step: int, metrics: Dict[str, float], echo=print) -> None:
        if not self.enabled:
            return
        row = {"step": step, **{k: (float(v) if isinstance(v, (int, float)) else v) for k, v in metrics.items()}}
        self._file.write(json.dumps(row) + "\n")
        self._file.flush()
        if self._writer is not None:
            for key, value in row.items():
                if key != "step" and isinstance(value, float) and math.isfinite(value):
                    self._writer.add_scalar(tag=key, value=value, step=step)
        if echo is not None:
            echo(f"step {step}: " + ", ".join(f"{k}={_format(v)}" for k, v in metrics.items()))

    def log_histogram(self, tag: str, values, step: int) -> None:
        if self.enabled and self._writer is not None:
            self._writer.add_histogram(tag=tag, values=values, step=step, buckets=20)

    def close(self) -> None:
        if self.enabled:
            self._file.close()
            if self._writer is not None:
                self._writer.close()
