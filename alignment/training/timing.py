"""Wall time of the phases of a training step, entered like the offload phases (alignment/wrappers/offload.py):

    timer = PhaseTimer()
    with timer.phase("generate"):
        ...
    metrics.update(timer.times)   # {"time/generate": seconds, ...}
"""
from __future__ import annotations

import contextlib
import time
from typing import Dict


class PhaseTimer:
    def __init__(self):
        self.times: Dict[str, float] = {"time/step_start": time.time()}  # wall clock: timelines line steps up

    @contextlib.contextmanager
    def phase(self, name: str):
        """Records time/<name>: the seconds the block took (also when it raises)."""
        start = time.perf_counter()
        try:
            yield
        finally:
            self.times[f"time/{name}"] = time.perf_counter() - start
