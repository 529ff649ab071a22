"""KL estimators, registered by name (alignment/config/registry.py): `kl_estimator` picks the one of the KL in the
reward (or in the loss with kl_in_loss) and of the logged KL, `kl_loss_estimator` the one of GRPO's KL loss term.
The math is algorithms.py's; a class only names it and says where it may be used.
"""
from __future__ import annotations

from alignment.config.registry import KL_ESTIMATORS, Registered
from alignment.ppo import algorithms as rl


class KLEstimator(Registered, registry=KL_ESTIMATORS):
    """estimate(log_probs, ref_log_probs) [B, T] -> per-token estimate of KL(p || q) [B, T]."""

    loss_only = False  # only a kl_loss_estimator (its value or gradient is meant for the loss term)

    @staticmethod
    def estimate(log_probs, ref_log_probs):
        raise NotImplementedError


class K1(KLEstimator):
    NAME = "k1"
    estimate = staticmethod(rl.k1)


class K2(KLEstimator):
    NAME = "k2"
    estimate = staticmethod(rl.k2)


class K3(KLEstimator):
    NAME = "k3"
    estimate = staticmethod(rl.k3)


class LowVarKL(KLEstimator):
    NAME = "low_var_kl"
    loss_only = True
    estimate = staticmethod(rl.low_var_kl)


class StraightThrough(KLEstimator):
    """The value of `base`'s estimate with k2's gradient (verl's "+" estimators)."""

    loss_only = True
    base = None

    @classmethod
    def estimate(cls, log_probs, ref_log_probs):
        return rl.with_k2_gradient(cls.base(log_probs, ref_log_probs), log_probs, ref_log_probs)


class K1Plus(StraightThrough):
    NAME = "k1+"
    base = staticmethod(rl.k1)


class K3Plus(StraightThrough):
    NAME = "k3+"
    base = staticmethod(rl.k3)


class LowVarKLPlus(StraightThrough):
    NAME = "low_var_kl+"
    base = staticmethod(rl.low_var_kl)


def kl_estimate(name: str):
    """The per-token estimate function registered as `name`."""
    return KL_ESTIMATORS[name].estimate
