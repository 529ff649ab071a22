"""PPO's update, one loop for every layout: `update_iters` passes over the rollout in micro-batches of similar
length, gradient_accumulation_steps micro-batches per optimizer step. How one step's micro-batches are run is a
strategy: `EagerMicroBatches` (forward and backward of each in turn, here) or, under pipeline parallelism,
pipeline_update.PipelineMicroBatches (fleet's 1F1B schedule). Losses are means over all the micro-batches of an
optimizer step on every data rank, so any split into micro-batches and processes trains the same.
"""
from __future__ import annotations

import contextlib
from typing import Callable, Dict, List

import numpy as np
import paddle

from alignment.parallel.distributed import step_shares
from alignment.ppo.rl_math.objective import aggregation, step_weight
from alignment.ppo.rollout.rollout import response_log_probs, update_order
from alignment.training.trainer import mean_rows

PER_MICRO_BATCH_MEANS = ("lr", "kl")  # actor_step statistics that are not token-weighted shares


def run_update(rollout, micro_batches, optimizer_step: Callable[[], object], rng, ppo, train_args) -> Dict[str, float]:
    """The update loop: per optimizer step, micro_batches.run(rollout, row indices of each micro-batch) (its
    statistics), then optimizer_step(). -> the mean of the steps' statistics."""
    size, accum, rows = train_args.per_device_train_batch_size, train_args.gradient_accumulation_steps, []
    with micro_batches.running():
        for _ in range(ppo.update_iters):
            parts = pass_micro_batches(rollout, rng, size, ppo)
            for first in range(0, len(parts), accum):
                rows.append(micro_batches.run(rollout, parts[first: first + accum]))
                optimizer_step()
    return mean_rows(rows)


def first_pass_log_probs(model, rollout, ppo, train_args, step: int, around=None):
    """log_probs_as_updated over the micro-batches of step `step`'s first update pass. -> [N, R]"""
    parts = pass_micro_batches(rollout, update_rng(train_args.seed, step), train_args.per_device_train_batch_size,
                               ppo)
    return log_probs_as_updated(model, rollout, parts, ppo.temperature, ppo.shared_prompt_forward, around)


def update_rng(seed: int, step: int):
    """The random generator of step `step`'s update (its micro-batch orders)."""
    return np.random.default_rng(seed + 7919 * step)


def pass_micro_batches(rollout, rng, size: int, ppo) -> List[np.ndarray]:
    """Row indices of each micro-batch of one pass over the rollout (`size` rows each, the last maybe fewer). With
    shared_prompt_forward the answers to one prompt (num_return_sequences consecutive rows) stay together when
    they fit the micro-batches evenly, so each prompt runs once per pass."""
    n = ppo.num_return_sequences
    together = n if ppo.shared_prompt_forward and n > 1 and size % n == 0 and len(rollout) % n == 0 else 1
    order = update_order(rng, rollout.attention_mask.sum(axis=1).numpy(), size, ppo.group_by_length,
                         together)  # [N]
    return [order[s: s + size] for s in range(0, len(rollout), size)]


@paddle.no_grad()
def log_probs_as_updated(model, rollout, micro_batches: List[np.ndarray], temperature: float,
                         share_prompts: bool = False, around=None):
    """Log-probs [N, R] of the rollout's responses computed as the update computes them: micro-batch by
    micro-batch (the rows of each, packed), so at the same weights they are bitwise the update's and the first
    pass's ratios are exactly 1 (one pass over the whole padded rollout differs by float rounding, ~1e-7).
    around(model, micro-batch): the context each forward runs in (routing_replay.py's; None: none)."""
    parts = []
    for rows in micro_batches:
        batch = rollout.micro_batch(rows, share_prompts)
        with around(model, batch) if around is not None else contextlib.nullcontext():
            log_probs, _ = response_log_probs(model, batch.input_ids, batch.attention_mask, batch.prompt_len,
                                              temperature, response_index=batch.response_index,
                                              prompt_groups=batch.prompt_groups)  # [n, keep]
        parts.append(log_probs)
    return joined_rows(rollout, micro_batches, parts)


def joined_rows(rollout, micro_batches: List[np.ndarray], parts: List[paddle.Tensor]) -> paddle.Tensor:
    """One [N, R] tensor of the rollout's rows from each micro-batch's [n, keep] part (its first keep response
    columns; zeros after them)."""
    out = np.zeros(rollout.response_mask.shape, dtype="float32")  # [N, R]
    for rows, part in zip(micro_batches, parts):
        out[rows, : part.shape[1]] = part.numpy()
    return paddle.to_tensor(out)


class EagerMicroBatches:
    """The critic's micro-batches, then the actor's: backward of each one's share of the step's critic loss
    (critic: critic.py's strategy) and actor loss (actor_step(batch, share, ptx_scale) -> its share of each
    statistic). A rollout without advantages gets them in between (advantages(rollout) -> their metrics, which
    join the step's): the critic's first step has just computed the old values (Critic.values_in_update)."""

    def __init__(self, actor_step: Callable, critic, ppo, advantages: Callable = None):
        self.actor_step, self.critic, self.ppo, self.advantages = actor_step, critic, ppo, advantages

    def running(self):
        return contextlib.nullcontext()

    def run(self, rollout, micro_batches: List[np.ndarray]) -> Dict[str, float]:
        batches = [rollout.micro_batch(rows, self.ppo.shared_prompt_forward) for rows in micro_batches]
        shares = step_shares([float(batch.response_mask.astype("float32").sum()) for batch in batches])
        actor_shares = shares if aggregation(self.ppo) == "token-mean" else step_shares(  # one collective less
            [step_weight(self.ppo, batch.response_mask) for batch in batches])
        step = {}
        for batch, share in zip(batches, shares):
            add_shares(step, self.critic.train_step(batch, share), len(batches))
        if self.critic.values_in_update and rollout.advantages is None:
            if sum(map(len, micro_batches)) != len(rollout):  # PPOTrainer takes values_in_update only when it holds
                raise RuntimeError("the critic's first optimizer step must take the whole rollout for its old values")
            rollout.old_values = joined_rows(rollout, micro_batches, [batch.old_values for batch in batches])
            step.update(self.advantages(rollout))
            for rows, batch in zip(micro_batches, batches):  # the advantages [n, keep] the actor's loss reads
                batch.advantages = paddle.gather(rollout.advantages, paddle.to_tensor(rows))[
                    :, : batch.response_mask.shape[1]]
        for batch, actor_share in zip(batches, actor_shares):
            add_shares(step, self.actor_step(batch, actor_share, ptx_scale=1.0 / len(batches)), len(batches))
        return step


def add_shares(step: Dict[str, float], stats: Dict[str, float], micro_batches: int) -> None:
    """Adds one micro-batch's statistics to the step's: token-weighted shares add up; per-row means average."""
    for key, value in stats.items():
        step[key] = step.get(key, 0.0) + (value / micro_batches if key in PER_MICRO_BATCH_MEANS else value)
