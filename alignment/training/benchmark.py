"""`benchmark: true`, PaddleNLP's throughput mode: the run trains its steps without evaluating or saving anything
(no step checkpoints, no final model; PaddleNLP's DPO/SFT scripts set do_eval false, save and evaluation strategies
"no", logging every step unless disable_tqdm, and skip save_model), and reports its speed at the end as
PaddleNLP's scripts do:

    [timelog] Effective ratio: 71.35 % (2026-12-01 12:00:00)          non-padding share of the tokens trained
    [timelog] Effective tokens per second: 1530.20 token/s (...)       non-padding tokens / training time
    [timelog] Tokens per second: 2144.61 token/s (...)                 tokens through the model / training time
    [timelog] Step time: 0.812 s (...)                                  mean seconds per optimizer step

over all processes (PaddleNLP counts total tokens as micro-batches x max_seq_len because it packs rows to that
length; here micro-batches are padded to their longest row, so these are the tokens the model computed). Lines
with each rank's peak resident memory while training (the high-water mark is reset when training starts) and the
trained weights and AdamW states it holds (what sharding splits) follow, and the same figures go to metrics.jsonl
as `benchmark/*` keys. With ALIGNMENT_MALLOC=heap (alignment/cpu_env.py's default) memory freed before training
(a model loaded whole, then sliced) stays resident and counts; ALIGNMENT_MALLOC=system with glibc's
MALLOC_MMAP_THRESHOLD_=65536 returns freed tensors to the system, so the peak is what training itself holds.
Logged rows carry PaddleNLP's interval metrics (interval_runtime, interval_steps_per_second,
interval_samples_per_second, interval_tokens_per_second_per_device) when the stage counts its tokens.
"""
from __future__ import annotations

import resource
import time
from typing import Dict, List, Optional

GIB = 2 ** 30


def tensors_gib(tensors) -> float:
    """GiB held by the tensors that hold data."""
    return sum(t._numel() * t.element_size() for t in tensors if t._is_initialized()) / GIB


def reset_peak_rss() -> bool:
    """Start this process's peak resident memory afresh (Linux: "5" to /proc/self/clear_refs resets VmHWM to the
    memory resident now); False where that is not possible."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def peak_rss_gib() -> float:
    """This process's peak resident memory since reset_peak_rss (VmHWM), else since it started (ru_maxrss, KiB)."""
    try:
        with open("/proc/self/status") as f:
            return next(int(line.split()[1]) for line in f if line.startswith("VmHWM:")) * 1024 / GIB
    except (OSError, StopIteration, ValueError):
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / GIB


class Throughput:
    """Times every optimizer step and adds up what the stage reports it trained (`counts`: samples, tokens,
    padded tokens over all processes, or None when the stage does not count them)."""

    def __init__(self):
        reset_peak_rss()  # the peak while training, not while loading the model (which stage 3 then slices)
        self.steps: List[float] = []
        self.totals = {"samples": 0.0, "tokens": 0.0, "padded_tokens": 0.0}
        self.window_start = time.perf_counter()
        self.window_steps = 0
        self.window_totals = dict(self.totals)

    def record(self, seconds: float, counts: Optional[Dict[str, float]]) -> None:
        self.steps.append(seconds)
        self.window_steps += 1
        for key, value in (counts or {}).items():
            self.totals[key] += value
            self.window_totals[key] += value

    def interval(self, processes: int) -> Dict[str, float]:
        """PaddleNLP's interval_* metrics of the steps since the last logged row (then a new interval starts)."""
        runtime = time.perf_counter() - self.window_start
        out = {"interval_runtime": runtime, "interval_steps_per_second": self.window_steps / runtime}
        if self.window_totals["samples"]:
            out["interval_samples_per_second"] = self.window_totals["samples"] / runtime
            out["interval_tokens_per_second_per_device"] = self.window_totals["padded_tokens"] / runtime / processes
        self.window_start, self.window_steps = time.perf_counter(), 0
        self.window_totals = dict.fromkeys(self.totals, 0.0)
        return out

    def summary(self) -> Dict[str, float]:
        seconds = sum(self.steps)
        out = {"benchmark/step_time": seconds / max(1, len(self.steps)), "benchmark/train_runtime": seconds}
        if len(self.steps) > 1:
            out["benchmark/step_time_after_first"] = sum(self.steps[1:]) / (len(self.steps) - 1)
        if self.totals["padded_tokens"]:
            out.update({"benchmark/effective_ratio": self.totals["tokens"] / self.totals["padded_tokens"],
                        "benchmark/effective_tokens_per_second": self.totals["tokens"] / seconds,
                        "benchmark/tokens_per_second": self.totals["padded_tokens"] / seconds})
        return out


def timelog_lines(summary: Dict[str, float], ranks: List[Dict[str, float]]) -> List[str]:
    """PaddleNLP's [timelog] lines for a summary, then every rank's peak resident memory and the trained weights
    and AdamW states it holds (`ranks`: {"peak_rss", "weights", "adamw"} GiB per rank)."""
    now = time.strftime("%Y-%m-%d %H:%M:%S")
    lines = []
    if "benchmark/tokens_per_second" in summary:
        lines += [f"[timelog] Effective ratio: {100 * summary['benchmark/effective_ratio']:.2f} % ({now})",
                  f"[timelog] Effective tokens per second: {summary['benchmark/effective_tokens_per_second']:.2f} "
                  f"token/s ({now})",
                  f"[timelog] Tokens per second: {summary['benchmark/tokens_per_second']:.2f} token/s ({now})"]
    lines.append(f"[timelog] Step time: {summary['benchmark/step_time']:.3f} s ({now})")
    for key, what in (("peak_rss", "peak resident memory"), ("weights", "trained weights held"),
                      ("adamw", "AdamW states held")):
        lines.append(f"{what} per rank (GiB): " + " ".join(f"{rank[key]:.3f}" for rank in ranks))
    return lines
