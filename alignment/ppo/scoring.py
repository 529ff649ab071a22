"""The phases of scoring a rollout that are not model passes: DAPO's overlong penalty on the end rewards, their
statistics and normalisation, the gold reward, whether each response ended, and the length metrics. ppo/trainer.py's
score() runs them in order after the log-prob and value passes; the DAPO math is dapo.py's.
"""
from __future__ import annotations

from typing import Dict, List, Optional, Tuple

import numpy as np
import paddle

from alignment.parallel.distributed import gather_lists
from alignment.ppo import algorithms as rl
from alignment.ppo import dapo
from alignment.rewards.functions import gold_scores


def with_overlong_penalty(end_rewards, parts: Dict[str, float], rollout, ppo) -> Tuple[paddle.Tensor, Dict]:
    """With enable_overlong_reward_buffer (DAPO's soft overlong punishment), responses near the length budget lose
    reward: (end rewards [N] + penalty, parts + reward/overlong_penalty); else both unchanged."""
    if not ppo.enable_overlong_reward_buffer:
        return end_rewards, parts
    penalty = dapo.overlong_penalty(rollout.response_mask.sum(axis=1), ppo.max_new_tokens,
                                    ppo.overlong_reward_buffer, ppo.overlong_penalty_factor)  # [N]
    parts["reward/overlong_penalty"] = float(penalty.mean())
    return end_rewards + penalty, parts


def reward_statistics(end_rewards, parts: Dict[str, float], normalizer=None) -> Tuple[paddle.Tensor, Dict]:
    """(end rewards [N], normalised by `normalizer`'s running statistics of whole batches when one is given, and
    reward/mean, reward/std of the global batch with each reward part's mean)."""
    every = paddle.to_tensor(gather_lists(end_rewards.numpy().tolist()), dtype="float32")  # the global batch's
    metrics = {"reward/mean": float(every.mean()), "reward/std": float(every.std(unbiased=False)), **parts}
    if normalizer is not None:  # statistics of the whole batch, identical on every rank
        normalizer.update(every)
        end_rewards = normalizer.normalize(end_rewards)
    return end_rewards, metrics


def gold_reward(judge: Optional[str], rollout) -> Dict[str, float]:
    """gold_reward/mean of the offline judge (never trained on); {} without one."""
    gold = gold_scores(judge, rollout.prompts, rollout.completions, rollout.labels)
    return {} if gold is None else {"gold_reward/mean": float(gold.mean())}


def ended_responses(rollout, eos_ids) -> List[bool]:
    """Whether each response's last token is one of the ids generation stops on (False: cut off, or empty)."""
    last = rl.last_valid_index(rollout.response_mask)  # [N]: the last response token (-1: none)
    tokens = paddle.take_along_axis(rollout.input_ids[:, rollout.prompt_len:], last.clip(min=0).unsqueeze(1),
                                    axis=1).squeeze(1)  # [N]
    eos = set(eos_ids)
    return [int(i) >= 0 and int(t) in eos for i, t in zip(last.numpy(), tokens.numpy())]


def length_metrics(lengths, ended: List[bool]) -> Dict[str, float]:
    """response_length (mean of lengths [N]) and truncated (the fraction of responses that did not end)."""
    return {"response_length": float(lengths.mean()), "truncated": 1.0 - float(np.mean(ended))}


def log_prob_diff(sampler_log_probs, trainer_log_probs, mask) -> Dict[str, float]:
    """rollout/log_prob_diff_max and _p99: |sampler - trainer| log-prob of the response tokens (the sampling pass's
    own, rollout_log_probs, against the trainer's recomputation), max and 99th percentile over the global batch.
    All [N, R]."""
    diff = (sampler_log_probs - trainer_log_probs).abs().numpy()[mask.numpy() > 0]  # [tokens]
    every = np.asarray(gather_lists(diff.tolist()), dtype="float64")  # the global batch's
    if every.size == 0:
        return {"rollout/log_prob_diff_max": 0.0, "rollout/log_prob_diff_p99": 0.0}
    return {"rollout/log_prob_diff_max": float(every.max()),
            "rollout/log_prob_diff_p99": float(np.percentile(every, 99))}
