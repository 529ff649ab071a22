"""Score normalizers (safe-rlhf's): track the mean / variance of end scores and standardise them.

RunningMeanStd: exact running statistics over everything seen (Chan et al.'s parallel update).
ExponentialMovingAverage: mean and variance as EMAs with `momentum` (recent batches weigh more).
Identity: no-op. State is plain floats, saved next to the weights (`score_normalizer.json`).
"""
from __future__ import annotations

import json
import os

import paddle

from alignment.inputs import FINITE, TEXT, check_keys, integer, number, read_json

NORMALIZER_FILE = "score_normalizer.json"
from alignment.config.choices import NORMALIZER_TYPES


class Normalizer:
    def __init__(self, momentum: float = 0.9, epsilon: float = 1e-8):
        self.momentum, self.epsilon = momentum, epsilon
        self.mean, self.var, self.count = 0.0, 1.0, 0

    def update(self, values: paddle.Tensor) -> None:
        raise NotImplementedError

    def normalize(self, values: paddle.Tensor) -> paddle.Tensor:
        return (values - self.mean) / (self.var + self.epsilon) ** 0.5

    def state_dict(self) -> dict:
        return {"type": type(self).__name__, "mean": self.mean, "var": self.var, "count": self.count,
                "momentum": self.momentum}

    def load_state_dict(self, state: dict) -> None:
        if state.get("type") != type(self).__name__:
            raise ValueError(f"normalizer state is for {state.get('type')}, not {type(self).__name__}")
        self.mean, self.var, self.count = float(state["mean"]), float(state["var"]), int(state["count"])

    def save(self, path: str) -> None:
        with open(os.path.join(path, NORMALIZER_FILE), "w", encoding="utf-8") as f:
            json.dump(self.state_dict(), f, indent=2)


class RunningMeanStd(Normalizer):
    def update(self, values):
        values = values.astype("float32").flatten()
        n = int(values.shape[0])
        if n == 0:
            return
        batch_mean = float(values.mean())
        batch_var = float(((values - batch_mean) ** 2).mean())
        total = self.count + n
        delta = batch_mean - self.mean
        if self.count == 0:
            self.mean, self.var = batch_mean, batch_var
        else:
            m2 = self.var * self.count + batch_var * n + delta**2 * self.count * n / total
            self.mean, self.var = self.mean + delta * n / total, m2 / total
        self.count = total


class ExponentialMovingAverage(Normalizer):
    def update(self, values):
        values = values.astype("float32").flatten()
        if int(values.shape[0]) == 0:
            return
        batch_mean = float(values.mean())
        batch_var = float(((values - batch_mean) ** 2).mean())
        if self.count == 0:
            self.mean, self.var = batch_mean, batch_var
        else:
            self.mean = self.momentum * self.mean + (1 - self.momentum) * batch_mean
            self.var = self.momentum * self.var + (1 - self.momentum) * batch_var
        self.count += int(values.shape[0])


class Identity(Normalizer):
    def update(self, values):
        self.count += int(values.flatten().shape[0])

    def normalize(self, values):
        return values


def make_normalizer(kind: str, momentum: float = 0.9) -> Normalizer:
    classes = {cls.__name__: cls for cls in (RunningMeanStd, ExponentialMovingAverage, Identity)}
    if kind not in classes:
        raise ValueError(f"normalizer_type must be one of {NORMALIZER_TYPES}, got {kind!r}")
    return classes[kind](momentum=momentum)


def load_normalizer(path: str, kind: str, momentum: float = 0.9) -> Normalizer:
    """The saved normalizer of a score-model checkpoint, or a fresh one when the checkpoint has none."""
    file = os.path.join(path, NORMALIZER_FILE)
    if not os.path.exists(file):
        return make_normalizer(kind, momentum)
    state = check_keys(read_json(file, "normalizer state"), STATE_KEYS, file, required=("mean", "var", "count"),
                       what="normalizer state")
    try:
        normalizer = make_normalizer(state.get("type", kind), float(state.get("momentum", momentum)))
        normalizer.load_state_dict(state)
    except ValueError as err:
        raise ValueError(f"{file}: {err}") from None
    return normalizer


STATE_KEYS = {"type": TEXT, "mean": FINITE, "var": number(at_least=0), "count": integer(0),
              "momentum": number(at_least=0, at_most=1)}
