"""Run logs, the same for every stage: `metrics.jsonl` (one JSON object per logged step), the trackers `report_to`
asks for (alignment/training/trackers/: VisualDL, TensorBoard, wandb, ...), the console."""
from __future__ import annotations

import json
import os
import sys
from typing import Dict, List, Tuple

from alignment.fileio import write_json_atomic, write_text_atomic
from alignment.inputs import check_keys, integer, json_lines
from alignment.parallel.distributed import is_main_process


def _format(value) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


class MetricsLogger:
    """Nothing is written until the first `log` call, so a run that fails before its first step leaves no files;
    `first_files` ({name: JSON data}, e.g. the effective arguments) are written then, before the first row."""

    def __init__(self, output_dir: str, enabled: bool = True, trackers=None, first_files=None):
        """`enabled` is False on non-zero ranks: only rank 0 writes; `trackers`: a TrackerFanOut (None: none)."""
        self.enabled, self.output_dir, self.trackers = enabled, output_dir, trackers
        self.first_files = first_files or {}
        self.path = os.path.join(output_dir, "metrics.jsonl")
        self._file = None
        self._row_files = set()
        self.resume_step = None

    def resume_at(self, step: int) -> None:
        """A resumed run: keep the rows of steps <= `step` in metrics.jsonl and the row files, append after them."""
        self.resume_step = step

    def _keep_rows_until(self, path: str, step: int) -> None:
        if not os.path.exists(path):
            return
        lines = []
        with open(path, encoding="utf-8", errors="replace") as f:
            for line in f:
                try:
                    row = json.loads(line)
                except ValueError:  # a row cut short by a kill: the resumed run logs that step again
                    continue
                if isinstance(row, dict) and row.get("step", 0) <= step:
                    lines.append(line if line.endswith("\n") else line + "\n")
        write_text_atomic(path, "".join(lines))

    def _open(self) -> None:
        os.makedirs(self.output_dir, exist_ok=True)
        for name, data in self.first_files.items():
            write_json_atomic(os.path.join(self.output_dir, name), data)
        if self.resume_step is None:
            self._file = open(self.path, "w", encoding="utf-8")  # a new run starts a new log
        else:
            self._keep_rows_until(self.path, self.resume_step)
            self._file = open(self.path, "a", encoding="utf-8")
        if self.trackers is not None:
            self.trackers.open(self.resume_step)

    def log(self, step: int, metrics: Dict[str, float], echo=print) -> None:
        if not self.enabled:
            return
        if self._file is None:
            self._open()
        row = {"step": step, **{k: (float(v) if isinstance(v, (int, float)) else v) for k, v in metrics.items()}}
        self._file.write(json.dumps(row) + "\n")
        self._file.flush()
        if self.trackers is not None:
            self.trackers.log(step, row)
        if echo is not None:
            echo(f"step {step}: " + ", ".join(f"{k}={_format(v)}" for k, v in metrics.items()))

    def write_rows(self, name: str, rows) -> None:
        """Append JSON rows to `<output_dir>/<name>` (emptied at its first use in this run), e.g. generations."""
        if not self.enabled:
            return
        if self._file is None:
            self._open()
        path = os.path.join(self.output_dir, name)
        if name not in self._row_files and self.resume_step is not None:
            self._keep_rows_until(path, self.resume_step)
        mode = "a" if name in self._row_files or self.resume_step is not None else "w"
        self._row_files.add(name)
        with open(path, mode, encoding="utf-8") as f:
            f.writelines(json.dumps(row, ensure_ascii=False) + "\n" for row in rows)

    def log_histogram(self, tag: str, values, step: int) -> None:
        if self.trackers is not None and self._file is not None:
            self.trackers.log_histogram(tag, values, step)

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
        if self.trackers is not None:
            self.trackers.close()


def read_series(path: str) -> Dict[str, List[Tuple[int, float]]]:
    """{metric: [(step, value), ...]} for the numeric metrics of a metrics.jsonl file."""
    series: Dict[str, List[Tuple[int, float]]] = {}
    for line, row in json_lines(path, "metrics file"):
        check_keys(row, {"step": integer(0)}, path, required=("step",), what="metrics row", line=line)
        for key, value in row.items():
            if key != "step" and isinstance(value, (int, float)) and not isinstance(value, bool):
                series.setdefault(key, []).append((row["step"], float(value)))
    return series


def hide_progress(args) -> bool:
    """Progress bars only on a terminal, on the main process, and unless disable_tqdm: where the output goes to a
    file or a pipe (CI, nohup), a bar's updates would fill it; there the one line per logging step remains."""
    return args.disable_tqdm or not is_main_process() or not sys.stderr.isatty()
