"""What the adapters share: importing a library with a one-line hint, a row's episode seed, observations as
text, and private global random state for libraries that seed Python's and numpy's global generators.
Pure Python (no paddle)."""
from __future__ import annotations

import contextlib
import importlib
import json
import math
import random
import threading
import zlib
from typing import Any, Dict, Iterator, List, Mapping

import numpy as np

from alignment.envs.base import Message


def require(module: str, package: str, environment: str):
    """`import module`, or an ImportError naming the environment and the pip package that provides it."""
    try:
        return importlib.import_module(module)
    except ImportError as err:
        raise ImportError(f"environment {environment!r} needs the {package!r} package ({err}); install it with "
                          f"`pip install -r requirements.txt` (extra 'envs')") from None


def row_seed(row: Mapping[str, Any]) -> int:
    """The episode's seed: the row's `seed` column, else a stable hash of the row, so the answers sampled for one
    prompt (a GRPO group) play the same game and a row replays the same game in every run."""
    seed = row.get("seed")
    if seed is not None:
        if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
            raise ValueError(f"row key 'seed' must be a non-negative integer, got {seed!r}")
        return seed
    text = json.dumps({k: v for k, v in row.items() if k != "seed"}, sort_keys=True, default=str)
    return zlib.crc32(text.encode("utf-8"))


def as_text(observation: Any) -> str:
    """A library's observation as the text the policy reads (strings as they are, anything else as JSON)."""
    if isinstance(observation, str):
        return observation
    try:
        return json.dumps(observation, ensure_ascii=False, sort_keys=True, default=str)
    except (TypeError, ValueError):
        return str(observation)


def user_message(observation: Any) -> List[Message]:
    text = as_text(observation)
    return [{"role": "user", "content": text}] if text else []


def numbers(info: Any) -> Dict[str, float]:
    """The numeric (and true/false, as 1/0) entries of a library's info dict: the metrics a StepResult carries."""
    if not isinstance(info, Mapping):
        return {}
    return {str(key): float(value) for key, value in info.items()
            if isinstance(value, (int, float)) and math.isfinite(value)}


_GLOBAL_RANDOM = threading.Lock()


class PrivateRandom:
    """Global random state of one episode. Some libraries (GEM's `reset(seed)`, TextArena's states) seed and draw
    from Python's `random` and numpy's global generator; `with episode_random:` swaps this episode's state in
    (under one lock) and back out, so episodes played at once do not draw from each other's numbers and the
    trainer's own global state is left as it was."""

    def __init__(self, seed: int = 0):
        python, numpy_state = random.Random(seed).getstate(), np.random.RandomState(seed % 2 ** 32).get_state()
        self.state = (python, numpy_state)

    @contextlib.contextmanager
    def __call__(self) -> Iterator[None]:
        with _GLOBAL_RANDOM:
            outer = (random.getstate(), np.random.get_state())
            random.setstate(self.state[0])
            np.random.set_state(self.state[1])
            try:
                yield
            finally:
                self.state = (random.getstate(), np.random.get_state())
                random.setstate(outer[0])
                np.random.set_state(outer[1])
