"""Per-token estimators of KL(p || q) from samples of p (Schulman, "Approximating KL divergence", 2020; verl
core_algos.kl_penalty), registered by name (alignment/config/registry.py): `kl_estimator` picks the one of the KL
in the reward (or in the loss with kl_in_loss) and of the logged KL, `kl_loss_estimator` the one of GRPO's KL loss
term. Pure math on paddle tensors, as algorithms.py: estimate(log_probs, ref_log_probs), both [B, T] -> [B, T].
"""
from __future__ import annotations

import paddle

from alignment.config.registry import KL_ESTIMATORS, Registered
from alignment.ppo.rl_math.algorithms import _f32


class KLEstimator(Registered, registry=KL_ESTIMATORS):
    """A per-token estimate of KL(p || q): `estimate(log_probs, ref_log_probs)`, both [B, T] -> [B, T]. Subclass
    with a `NAME` to register it; `loss_only` true: only `kl_loss_estimator` may name it."""

    loss_only = False  # only a kl_loss_estimator: its value or gradient is meant for the loss term

    @staticmethod
    def estimate(log_probs, ref_log_probs):
        raise NotImplementedError


class K1(KLEstimator):
    """log p - log q: unbiased, high variance, negative where q > p."""

    NAME = "k1"

    @staticmethod
    def estimate(log_probs, ref_log_probs):
        return _f32(log_probs) - _f32(ref_log_probs)  # [B, T]


class K2(KLEstimator):
    """0.5 (log p - log q)^2: biased, low variance, >= 0."""

    NAME = "k2"

    @staticmethod
    def estimate(log_probs, ref_log_probs):
        return 0.5 * K1.estimate(log_probs, ref_log_probs).square()  # [B, T]


class K3(KLEstimator):
    """exp(log q - log p) - (log q - log p) - 1: unbiased, low variance, >= 0."""

    NAME = "k3"

    @staticmethod
    def estimate(log_probs, ref_log_probs):
        log_ratio = K1.estimate(log_probs, ref_log_probs)  # [B, T]  log p - log q
        return paddle.exp(-log_ratio) + log_ratio - 1.0  # [B, T]


class LowVarKL(KLEstimator):
    """k3 with log q - log p clamped to [-20, 20] and the result to [-10, 10] (verl's "low_var_kl")."""

    NAME = "low_var_kl"
    loss_only = True

    @staticmethod
    def estimate(log_probs, ref_log_probs):
        log_ratio = paddle.clip(_f32(ref_log_probs) - _f32(log_probs), -20.0, 20.0)  # [B, T]  log q - log p
        return paddle.clip(paddle.exp(log_ratio) - log_ratio - 1.0, -10.0, 10.0)  # [B, T]


class StraightThrough(KLEstimator):
    """The value of `of`'s estimate with the gradient of k2, (log p - log q) grad log p, whose expectation under p
    is the gradient of KL(p || q): k2 - sg(k2) + sg(kl) (verl's "+" estimators)."""

    loss_only = True
    of = K1

    @classmethod
    def estimate(cls, log_probs, ref_log_probs):
        kl = cls.of.estimate(log_probs, ref_log_probs)  # [B, T]
        k2 = K2.estimate(log_probs, ref_log_probs)  # [B, T]
        return k2 - k2.detach() + kl.detach()


for _of in (K1, K3, LowVarKL):  # k1+, k3+, low_var_kl+
    type(f"{_of.__name__}Plus", (StraightThrough,), {"NAME": _of.NAME + "+", "of": _of, "__module__": __name__})


def kl_estimate(name: str):
    """The per-token estimate registered as `name`."""
    return KL_ESTIMATORS[name].estimate
