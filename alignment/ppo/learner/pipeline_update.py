"""PPO's update under pipeline parallelism: the micro-batches of update.py's loop, run through fleet's 1F1B
schedule with the actor loss (objective.py's, as in the eager update) and the value loss on the last stage (the
models are alignment/wrappers/pipeline.py's).

Rollouts are generated and scored by whole copies of the models (alignment/wrappers/reshard.py); only the update
goes through the pipeline.
"""
from __future__ import annotations

from typing import Dict, List

import numpy as np
import paddle
from paddle.distributed import fleet

from alignment.models.logprobs import entropy_from_logits, gather_log_probs
from alignment.parallel import tensor_parallel as tp
from alignment.parallel.distributed import data_world_size, model_parallel_degree, sum_over_data_ranks
from alignment.ppo.rl_math import algorithms as rl
from alignment.ppo.rl_math.objective import actor_objective, uses_defaults
from alignment.wrappers.pipeline import pipeline_step


def check_pipeline_run(ppo_args, train_args, rollouts: int, ptx_data) -> None:
    """What pipeline parallelism needs of a PPO run, checked before the first step."""
    chunk = train_args.per_device_train_batch_size * train_args.gradient_accumulation_steps
    if rollouts % chunk:
        raise ValueError(f"pipeline_parallel_degree > 1: the {rollouts} rollouts per process (per_device_prompt_"
                         f"batch_size x num_return_sequences) must split into micro-batches of "
                         f"per_device_train_batch_size x gradient_accumulation_steps = {chunk}")
    if ptx_data is not None:
        raise ValueError("key 'ptx_datasets' is not supported with pipeline_parallel_degree > 1 yet")
    if not uses_defaults(ppo_args):
        raise ValueError("keys policy_loss_mode / loss_agg_mode / clip_range_ratio_low|high / pg_loss_coeff / "
                         "entropy_coeff / kl_loss_coeff: only the default PPO objective runs with "
                         "pipeline_parallel_degree > 1 yet")
    if ppo_args.eval_mode == "tensor_parallel":
        raise ValueError("key 'eval_mode': pipeline_parallel_degree > 1 generates with a whole copy ('single')")


class PolicyPipeLoss:
    """PPO's actor loss on the last stage. labels: response ids, old log-probs, advantages, response mask,
    reference log-probs, all [b, R], and token_weight [b, 1]: data ranks x micro-batches / tokens of the optimizer
    step over all data ranks (the same in every row), so loss x tokens x weight / micro-batches (fleet's scaling)
    is this micro-batch's share of the step's token mean, exactly as step_shares() (parallel/distributed.py) scales it
    without a pipeline."""

    def __init__(self, ppo_args):
        self.ppo = ppo_args
        self.stats = {}

    def __call__(self, logits, labels):
        ids, old_log_probs, advantages, mask, ref_log_probs, token_weight = labels
        ppo, split = self.ppo, model_parallel_degree() > 1
        response = logits[:, logits.shape[1] - ids.shape[1] - 1: -1] / ppo.temperature  # [b, R, V(/n)]
        log_probs = tp.parallel_token_log_probs(response, ids) if split else gather_log_probs(response, ids)  # [b, R]
        loss, stats = actor_objective(ppo, log_probs, old_log_probs, advantages, mask, ref_log_probs, None,
                                      ppo.max_new_tokens or mask.shape[1])
        share = mask.astype("float32").sum() * token_weight[0, 0]  # this micro-batch's share of the batch mean
        with paddle.no_grad():
            entropy = rl.masked_mean(entropy_from_logits(
                tp.gather_vocab(response.detach()) if split else response.detach()), mask)
            for key, value in {"actor_loss": loss.detach(), "entropy": entropy, **stats}.items():
                self.stats[key] = self.stats.get(key, 0.0) + float(value) * float(share)
        return loss * share


class ValuePipeLoss:
    """The clipped value loss on the last stage. labels: old values, returns, response mask [b, R], and
    token_weight [b, 1] as in PolicyPipeLoss."""

    def __init__(self, ppo_args):
        self.ppo = ppo_args
        self.stats = {}

    def __call__(self, scores, labels):
        old_values, returns, mask, token_weight = labels
        values = scores[:, scores.shape[1] - old_values.shape[1] - 1: -1]  # [b, R]
        loss = rl.critic_loss(values, old_values, returns, mask, self.ppo.clip_range_value)
        share = mask.astype("float32").sum() * token_weight[0, 0]
        self.stats["critic_loss"] = self.stats.get("critic_loss", 0.0) + float(loss) * float(share)
        return loss * share


class PipelineMicroBatches:
    """update.py's strategy for pipeline models: one optimizer step's micro-batches (per_device_train_batch_size
    rows each) as one 1F1B run of gradient_accumulation_steps micro-batches."""

    def __init__(self, actor, critic, ppo_args, train_args, precision, lr, replay: bool = False):
        self.actor, self.critic, self.ppo, self.args = actor, critic, ppo_args, train_args
        self.replay = replay  # MoE routing replay: the actor's stages route to the rollout's recorded experts
        self.precision, self.lr = precision, lr  # lr(): the actor's learning rate
        self.actor_pipe = fleet.distributed_model(actor)
        self.critic_pipe = fleet.distributed_model(critic) if critic is not None else None

    def running(self):
        return self.precision.autocast()

    def run(self, rollout, micro_batches: List[np.ndarray]) -> Dict[str, float]:
        accum, ranks, scaler = len(micro_batches), data_world_size(), self.precision.scaler
        batch = rollout.select(paddle.to_tensor(np.concatenate(micro_batches))).trimmed()
        # the step's token mean over every micro-batch and data rank; x accum undoes fleet's 1/accum
        total = float(sum_over_data_ranks(batch.response_mask.sum()))
        weight = paddle.full([len(batch), 1], ranks * accum / max(total, 1e-12), dtype="float32")  # [n, 1]:
        # fleet slices every label along a second axis
        inputs = (batch.input_ids, batch.attention_mask)
        replayed = (*inputs, batch.experts) if self.replay and batch.experts is not None else inputs
        stats = pipeline_step(self.actor_pipe, replayed, (
            batch.input_ids[:, batch.prompt_len:], batch.old_log_probs, batch.advantages,
            batch.response_mask, batch.ref_log_probs, weight), self.actor._loss_fn[0], accum, scaler)
        stats["lr"] = self.lr()
        if self.critic_pipe is not None:
            stats.update(pipeline_step(self.critic_pipe, inputs, (
                batch.old_values, batch.returns, batch.response_mask, weight), self.critic._loss_fn[0],
                accum, scaler))
        return stats
