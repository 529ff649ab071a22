"""The phases of scoring a rollout that are not model passes: DAPO's overlong penalty on the end rewards, their
statistics and normalisation, the gold reward, whether each response ended, and the length metrics. ppo/ppo_trainer.py's
score() runs them in order after the log-prob and value passes; the DAPO math is dapo.py's.
"""
from __future__ import annotations

from typing import Callable, Dict, List, Optional, Tuple

import numpy as np
import paddle

from alignment.parallel.distributed import gather_lists
from alignment.ppo.rl_math import algorithms as rl
from alignment.ppo.rl_math import dapo
from alignment.ppo.rollout import episodes
from alignment.ppo.rl_math import off_policy
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


def with_environment_reward(end_rewards, parts: Dict[str, float], rollout, weight: float) -> Tuple[paddle.Tensor,
                                                                                                      Dict]:
    """A multi-turn rollout's end rewards [N] plus weight x each episode's environment reward (summed over its
    turns), and parts + reward/environment (its mean before the weight); a single-turn rollout's unchanged."""
    if rollout.episodes is None:
        return end_rewards, parts
    rewards = episodes.environment_rewards(rollout)  # [N]
    parts["reward/environment"] = float(rewards.mean())
    return end_rewards + paddle.to_tensor((weight * rewards).astype("float32")), parts


class EndRewards:
    """A rollout's end rewards [N] and each part's mean: a collaborator the trainer builds once (scoring calls it,
    and the rollout strategies through sources.StepDraws). The reward (model, server, functions; asked through the
    fault policy's `rewarded`, fault_policy.GroupFaults), + env_reward_weight x the environment's reward, the
    overlong penalty; each row's parts are written on the rollout."""

    def __init__(self, reward, faults, env_reward_weight: float, ppo, offload, precision):
        self.reward, self.faults, self.env_reward_weight, self.ppo = reward, faults, env_reward_weight, ppo
        self.offload, self.precision = offload, precision

    @paddle.no_grad()
    def __call__(self, rollout) -> Tuple[paddle.Tensor, Dict[str, float]]:
        rewards = with_environment_reward(*self.faults.rewarded(self.reward, rollout), rollout,
                                          self.env_reward_weight)
        rollout.reward_rows = reward_rows(self.reward.row_parts, rollout, self.reward.row_notes)
        return with_overlong_penalty(*rewards, rollout, self.ppo)

    def in_reward_phase(self, rollout) -> Tuple[paddle.Tensor, Dict[str, float]]:
        """The end rewards of a rollout drawn (its reward model brought in, under the run's precision)."""
        with self.offload.phase("reward", [self.reward.model]), self.precision.autocast():
            return self(rollout)


def reward_statistics(end_rewards, parts: Dict[str, float], normalizer=None,
                      group_size: int = 1) -> Tuple[paddle.Tensor, Dict]:
    """(end rewards [N], normalised by `normalizer`'s running statistics of whole batches when one is given, and
    reward/mean, reward/std of the global batch with each reward part's mean; with groups (group_size >= 2, a
    prompt's rows contiguous) reward/zero_variance_groups, the fraction of groups whose rewards are all equal)."""
    every = paddle.to_tensor(gather_lists(end_rewards.numpy().tolist()), dtype="float32")  # the global batch's
    metrics = {"reward/mean": float(every.mean()), "reward/std": float(every.std(unbiased=False)), **parts}
    if group_size >= 2 and every.shape[0] % group_size == 0:
        groups = every.reshape([-1, group_size])
        metrics["reward/zero_variance_groups"] = float((groups.max(axis=1) == groups.min(axis=1)).astype(
            "float32").mean())
    if normalizer is not None:  # statistics of the whole batch, identical on every rank
        normalizer.update(every)
        end_rewards = normalizer.normalize(end_rewards)
    return end_rewards, metrics


def gold_reward(judge: Optional[str], rollout) -> Dict[str, float]:
    """gold_reward/mean of the offline judge (never trained on); {} without one."""
    gold = gold_scores(judge, rollout.prompts, rollout.completions, rollout.labels)
    return {} if gold is None else {"gold_reward/mean": float(gold.mean())}


def ended_responses(rollout, eos_ids) -> List[bool]:
    """Whether each response's last token is one of the ids generation stops on (False: cut off, or empty); for
    multi-turn episodes, whether the environment ended them (False: cut by max_turns or the token budget)."""
    if rollout.episodes is not None:
        return [not episode["truncated"] for episode in rollout.episodes]
    last = rl.last_valid_index(rollout.response_mask)  # [N]: the last response token (-1: none)
    tokens = paddle.take_along_axis(rollout.input_ids[:, rollout.prompt_len:], last.clip(min=0).unsqueeze(1),
                                    axis=1).squeeze(1)  # [N]
    eos = set(eos_ids)
    return [int(i) >= 0 and int(t) in eos for i, t in zip(last.numpy(), tokens.numpy())]


def length_metrics(lengths, ended: List[bool]) -> Dict[str, float]:
    """response_length (mean of lengths [N]) and truncated (the fraction of responses that did not end)."""
    return {"response_length": float(lengths.mean()), "truncated": 1.0 - float(np.mean(ended))}


def generation_records(step: int, rollout, rewards: List[float]) -> List[Dict]:
    """One JSON row per response (eval_generations.jsonl): prompt, completion, reward; for a multi-turn episode
    also its turns, tool statistics, environment reward and whole conversation (tools/show_generations.py)."""
    records = [{"step": step, "prompt": p, "completion": c, "reward": r}
               for p, c, r in zip(rollout.prompts, rollout.completions, rewards)]
    for record, episode in zip(records, rollout.episodes or ()):
        record.update(episode)
    return records


def episode_means(records: List[Dict], prefix: str) -> Dict[str, float]:
    """episodes.episode_metrics over multi-turn records (each holds its episode's record), with `prefix` ({} if
    none)."""
    if not records or "turns" not in records[0]:
        return {}
    return episodes.episode_metrics(records, prefix)


def reward_rows(row_parts: Dict[str, np.ndarray], rollout, notes=None) -> List[Dict[str, float]]:
    """Each row's reward parts (the reward computer's, and a multi-turn episode's environment reward); notes:
    {judge spec: [per row {"prompt", "answer"}]} of model judges, kept under the row's "judges"."""
    parts = dict(row_parts)
    if rollout.episodes is not None:
        parts["environment"] = episodes.environment_rewards(rollout)
    rows = [{name: float(values[i]) for name, values in parts.items()} for i in range(len(rollout))]
    for i, row in enumerate(rows):
        if notes:
            row["judges"] = {spec: values[i] for spec, values in notes.items()}
    return rows


def off_policy_correction(rollout, version: int, cap: float) -> Dict[str, float]:
    """Asynchronous rollouts (rows tagged with the policy version that sampled them): the advantages of rows
    sampled by an older version than `version` weighted by off_policy.behaviour_weights, in place; -> the
    async/* metrics: mean staleness, the sampler-vs-trainer log-prob gap (max, p99) and the weights' mean on
    stale tokens. {} for a synchronous rollout."""
    if rollout.versions is None:
        return {}
    if rollout.token_versions is not None:  # partial rollouts: a version per token
        stale = rollout.token_versions < version  # [N, R]
        ages = (version - rollout.token_versions).astype("float32").numpy()[rollout.response_mask.numpy() > 0]
        out = {"async/staleness": float(ages.mean()) if ages.size else 0.0}
    else:
        versions = np.asarray(rollout.versions)
        stale = paddle.to_tensor(versions < version)  # [N]
        out = {"async/staleness": float(np.mean(version - versions))}
    if rollout.old_log_probs is None or rollout.behaviour_log_probs is None:
        return out
    mask = rollout.response_mask
    out["async/log_prob_gap_max"], out["async/log_prob_gap_p99"] = off_policy.log_prob_gap(
        rollout.old_log_probs, rollout.behaviour_log_probs, mask)
    weights = off_policy.behaviour_weights(rollout.old_log_probs, rollout.behaviour_log_probs, mask, stale, cap)
    use = (mask > 0) & off_policy.per_token(stale)  # [N, R]
    out["async/behaviour_weight"] = float(paddle.masked_select(weights, use).mean()) if bool(use.any()) else 1.0
    rollout.advantages = off_policy.corrected_advantages(rollout.advantages, rollout.old_log_probs,
                                                         rollout.behaviour_log_probs, mask, stale, cap)
    return out


class SamplerGap:
    """rollout_log_probs: the sampler-vs-trainer log-prob difference (log_prob_diff) measured on the update's own
    forward passes before its first optimizer step: the weights are then the sampler's, and those log-probs are
    bitwise what a separate pass over the rollout computes (update.log_probs_as_updated), so none is run. It covers
    the rows of the first optimizer step: the whole rollout when one optimizer step takes it all."""

    def __init__(self):
        self.diffs, self.armed, self.open = [], False, False

    def arm(self) -> None:
        """This step's old log-probs are the sampler's: measure them in the coming update."""
        self.armed = True

    def recording_until(self, optimizer_step: Callable):
        """optimizer_step, wrapped: recording stops at its first call."""
        self.diffs, self.open = [], self.armed

        def step(*args):
            self.open = False
            return optimizer_step(*args)
        return step

    def record(self, trainer_log_probs, sampler_log_probs, mask) -> None:
        """One micro-batch's log-probs [n, R] (trainer's, sampler's) and response mask [n, R]."""
        if self.open:
            gap = (rl._f32(sampler_log_probs) - rl._f32(trainer_log_probs.detach())).abs().numpy()
            self.diffs += gap[mask.numpy() > 0].tolist()

    def metrics(self) -> Dict[str, float]:
        if not self.armed:
            return {}
        self.armed = False
        return percentiles(self.diffs)


def percentiles(diffs) -> Dict[str, float]:
    """rollout/log_prob_diff_max and _p99 over the global batch of this rank's differences `diffs`."""
    every = np.asarray(gather_lists(list(diffs)), dtype="float64")  # the global batch's
    if every.size == 0:
        return {"rollout/log_prob_diff_max": 0.0, "rollout/log_prob_diff_p99": 0.0}
    return {"rollout/log_prob_diff_max": float(every.max()),
            "rollout/log_prob_diff_p99": float(np.percentile(every, 99))}


def log_prob_diff(sampler_log_probs, trainer_log_probs, mask) -> Dict[str, float]:
    """rollout/log_prob_diff_max and _p99: |sampler - trainer| log-prob of the response tokens (the sampling pass's
    own, rollout_log_probs, against the trainer's recomputation), max and 99th percentile over the global batch.
    All [N, R]."""
    diff = (sampler_log_probs - trainer_log_probs).abs().numpy()[mask.numpy() > 0]  # [tokens]
    return percentiles(diff.tolist())
