"""The critic's part of a PPO step, as a strategy: `Critic` when the advantage estimator needs_critic (old values
while scoring, the clipped value loss while updating) and `NoCritic` otherwise, so the trainer never asks which it
has.

When the update's first optimizer step takes the whole rollout, the critic's weights are still those that would
score it when that step's forward passes run, so a Critic given `returns_of` scores nothing beforehand: its first
train_step of each micro-batch takes its own values (detached) as the old values and their returns, and the
update computes the advantages from them before the actor's micro-batches (update.EagerMicroBatches). One forward
pass of the critic over the rollout less, and the first pass's value clipping sees old values that are bitwise
the update's."""
from __future__ import annotations

import contextlib
from typing import Callable, Dict, Optional, Union

import paddle

from alignment.ppo.rl_math import algorithms as rl
from alignment.ppo.rollout.rollout import critic_values


class NoCritic:
    """For the estimators that do not need a critic: no model, no values, no loss."""

    model = None
    values_in_update = False

    def old_values(self, rollout, version: int) -> None:
        return None

    def train_step(self, batch, share: float) -> Dict[str, float]:
        return {}


class Critic:
    """model: the trained ScoreModel (or its pipeline stages); whole_copy: a WholeCopy that scores rollouts when
    the trained model is split into pipeline stages (None: the model scores itself)."""

    def __init__(self, model, clip_range_value: float, whole_copy=None, precision=None,
                 returns_of: Optional[Callable] = None):
        self.model, self.clip_range_value, self.whole_copy = model, clip_range_value, whole_copy
        self.precision = precision  # training/precision.py: autocast and (fp16) loss scaling; None: float32
        self.returns_of = returns_of  # rollout -> the critic's targets [N, R] from its old values (see above)
        self.values_in_update = returns_of is not None

    @paddle.no_grad()
    def old_values(self, rollout, version: int):
        """Values [N, R] of the rollout's response tokens under the critic as it is now (before the update); None
        when the update's first critic pass gives them (values_in_update)."""
        if self.values_in_update:
            return None
        critic = self.model if self.whole_copy is None else self.whole_copy.refreshed(self.model, version=version)
        critic.eval()
        return critic_values(critic, rollout.input_ids, rollout.attention_mask, rollout.prompt_len)

    def train_step(self, batch, share: float) -> Dict[str, float]:
        """Backward of this micro-batch's `share` of the optimizer step's token-mean clipped value loss. Without
        old values (values_in_update, the first optimizer step), sets the batch's old values and returns."""
        with self.precision.autocast() if self.precision is not None else contextlib.nullcontext():
            values = critic_values(self.model, batch.input_ids, batch.attention_mask, batch.prompt_len,
                                   batch.response_index)  # [n, R]
        if batch.old_values is None:
            batch.old_values = values.detach().astype("float32")  # [n, R]
            batch.returns = self.returns_of(batch)  # [n, R]
        loss = rl.critic_loss(values, batch.old_values, batch.returns, batch.response_mask, self.clip_range_value)
        loss = loss * share
        if self.precision is not None:
            self.precision.backward(loss)
        else:
            loss.backward()
        return {"critic_loss": float(loss), "explained_variance": float(
            rl.explained_variance(values.detach(), batch.returns, batch.response_mask))}


def make_critic(model, clip_range_value: float, whole_copy=None, precision=None,
                returns_of: Optional[Callable] = None) -> Union[Critic, NoCritic]:
    """The strategy for `model`: a Critic, or NoCritic when there is no critic model (None)."""
    return NoCritic() if model is None else Critic(model, clip_range_value, whole_copy, precision, returns_of)
