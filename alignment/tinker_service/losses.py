"""The Tinker API's built-in losses (`forward_backward(data, loss_fn)`), one datum at a time, as pure functions
of the datum's target log-probs under the model being trained and its `loss_fn_inputs`. Every loss is a sum over
the datum's tokens (not a mean): Tinker's convention, which the SDK's custom-loss path relies on (it sends
`weights = -dC/dlogprobs` to cross_entropy and expects the gradient of C back).

    cross_entropy        sum_t -logp_t * w_t                                    inputs: target_tokens, weights
    importance_sampling  sum_t -rho_t * A_t,  rho_t = exp(logp_t - q_t)         inputs: target_tokens, logprobs (q,
                                                                                the sampler's), advantages
    ppo                  sum_t -min(rho_t A_t, clip(rho_t, lo, hi) A_t)         as importance_sampling; loss_fn_config
                                                                                clip_low_threshold (lo, 0.8),
                                                                                clip_high_threshold (hi, 1.2)

`weights` default to 1 for cross_entropy. The clipped objective is the project's PPO surrogate
(ppo/rl_math/surrogate.py: clipped_policy_loss with low = 1 - lo, high = hi - 1), summed over the datum's tokens.
"""
from __future__ import annotations

from typing import Callable, Dict, Mapping

import numpy as np
import paddle

from alignment.ppo.rl_math.surrogate import clipped_policy_loss, token_ratio

PPO_CLIP_LOW, PPO_CLIP_HIGH = 0.8, 1.2  # Tinker's documented defaults: epsilon 0.2 on both sides


class LossInputError(ValueError):
    """A datum lacks an input its loss needs, or an input has the wrong length (the caller's fault)."""


def _input(inputs: Mapping[str, np.ndarray], name: str, length: int, loss: str, default=None) -> paddle.Tensor:
    value = inputs.get(name)
    if value is None:
        if default is None:
            raise LossInputError(f"loss {loss!r} needs loss_fn_inputs[{name!r}]")
        value = np.full([length], default, np.float32)
    value = np.asarray(value, np.float32).reshape(-1)
    if value.shape[0] != length:
        raise LossInputError(f"loss_fn_inputs[{name!r}] has {value.shape[0]} values for {length} target tokens")
    return paddle.to_tensor(value)  # [N]


def cross_entropy(logprobs, inputs, config) -> paddle.Tensor:
    """logprobs [N] -> scalar sum_t -logp_t * w_t."""
    weights = _input(inputs, "weights", logprobs.shape[0], "cross_entropy", default=1.0)  # [N]
    return (-logprobs * weights).sum()


def importance_sampling(logprobs, inputs, config) -> paddle.Tensor:
    """logprobs [N] -> scalar sum_t -exp(logp_t - q_t) A_t."""
    n = logprobs.shape[0]
    sampled = _input(inputs, "logprobs", n, "importance_sampling")  # [N] q_t
    advantages = _input(inputs, "advantages", n, "importance_sampling")  # [N]
    ratio, _ = token_ratio(logprobs, sampled, paddle.ones([n]))  # [N]
    return (-ratio * advantages).sum()


def ppo(logprobs, inputs, config) -> paddle.Tensor:
    """logprobs [N] -> scalar sum_t -min(rho_t A_t, clip(rho_t, lo, hi) A_t)."""
    n = logprobs.shape[0]
    sampled = _input(inputs, "logprobs", n, "ppo")  # [N]
    advantages = _input(inputs, "advantages", n, "ppo")  # [N]
    low = float(config.get("clip_low_threshold", PPO_CLIP_LOW))
    high = float(config.get("clip_high_threshold", PPO_CLIP_HIGH))
    if not low <= 1.0 <= high:
        raise LossInputError(f"ppo needs clip_low_threshold <= 1 <= clip_high_threshold, got {low} and {high}")
    mask = paddle.ones([1, n])  # [1, N]
    ratio, _ = token_ratio(logprobs.unsqueeze(0), sampled.unsqueeze(0), mask)  # [1, N]
    return clipped_policy_loss(ratio, advantages.unsqueeze(0), mask, 1.0 - low, high - 1.0, "seq-mean-token-sum")


LOSSES: Dict[str, Callable] = {"cross_entropy": cross_entropy, "importance_sampling": importance_sampling,
                               "ppo": ppo}
