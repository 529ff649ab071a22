"""Multi-turn rollouts in the PPO-family trainer (key `environment`).

Each rollout row gets its own environment (alignment/envs), reset with the dataset row; envs/multiturn.py samples
the episode with the KV cache carried from turn to turn, and the trajectories are laid out as a Rollout
(rollout.py) whose "response" is everything after the prompt and whose response_mask marks the policy's own
tokens only: observations and template text carry no log-prob, KL, value, entropy or gradient. The token ids
trained on are the ids sampled (no decode and re-encode).

Rewards: the reward functions and the reward server read the final assistant message as the completion, the
reward model the whole conversation; the environment's reward (its turns' sum, times env_reward_weight) is added
to the end reward (scoring.with_environment_reward), or with per_turn_rewards placed turn by turn on each turn's
last token (`Rollout.turn_rewards`, read by the token-level estimators).
"""
from __future__ import annotations

from typing import Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np
import paddle

from alignment.envs.base import Environment, EnvironmentFailure, make_environment
from alignment.envs.multiturn import (Trajectory, environment_row, final_answer,  # noqa: F401 (agents.py's)
                                     multi_turn_rollout, pad_trajectories)
from alignment.models.moe import moe_blocks
from alignment.ppo.rollout.fault_policy import attempt_seed, play_with_retries
from alignment.ppo.rollout.rollout import Rollout


def build_environments(env_args, count: int) -> List[Environment]:
    """`count` new instances of the environment the arguments name; a name that is not registered or arguments its
    constructor refuses are a ValueError naming the key."""
    name = env_args.environment
    if name not in Environment.registered_names():
        raise ValueError(f"key 'environment': {name!r} is not a registered environment; registered: "
                         f"{', '.join(Environment.registered_names())} (a user environment registers when its "
                         f"file is listed in 'user_env_modules')")
    try:
        return [make_environment(name, **env_args.environment_args) for _ in range(count)]
    except (TypeError, ValueError) as err:
        raise ValueError(f"key 'environment_args': environment {name!r} refused them: {err}") from None


@paddle.no_grad()
def sample_episodes(actor, tokenizer, items: Sequence[Mapping], config, env_args, max_length: int,
                    num_return_sequences: int = 1, row_seeds: Optional[List[List[int]]] = None,
                    log_prob_temperature: Optional[float] = None, keep_failed: bool = False,
                    keep_experts: bool = False, draft=None) -> Rollout:
    """One episode per (item, return sequence), rows of one item contiguous, as a Rollout. config: the
    GenerationConfig of one turn; row_seeds: each row's own sampling seed (see multi_turn_rollout);
    log_prob_temperature: set old_log_probs from the sampling pass (None leaves them unset). An episode whose
    environment fails is played again with a fresh one up to episode_retries times (fault_policy.py); one that
    still fails is, with keep_failed, the prompt alone with its record's "error" set (the trainer drops its
    group), else its EnvironmentFailure raised. keep_experts: an MoE actor's expert choice per token on the
    rollout (Rollout.experts, in the columns of input_ids; routing_replay.py). draft: a draft model
    (models/draft_model.DraftModel) the episodes' engine speculates with."""
    rows = [environment_row(item) for item in items for _ in range(num_return_sequences)]
    row_items = [item for item in items for _ in range(num_return_sequences)]
    budget = env_args.max_trajectory_tokens or max_length
    # a tensor-parallel actor decodes on every rank of its group, which must take the same steps together
    schedule = "lockstep" if actor.config.tensor_parallel_degree > 1 else env_args.episode_schedule
    actor.eval()

    def play(indices: List[int], attempt: int) -> List[Trajectory]:  # fresh environments every attempt
        seeds = None if row_seeds is None else [attempt_seed(row_seeds[i], attempt) for i in indices]
        return multi_turn_rollout(actor, tokenizer, build_environments(env_args, len(indices)),
                                  [rows[i] for i in indices], config, env_args.max_turns, budget,
                                  log_prob_temperature or 1.0, max_length, seeds, env_args.env_workers, schedule,
                                  isolate_failures=True, keep_experts=keep_experts, draft=draft)

    trajectories, retries = play_with_retries(play, len(rows), env_args.episode_retries)
    failed = next((t.error for t in trajectories if t.error is not None), None)
    if failed is not None and not keep_failed:
        raise EnvironmentFailure(f"{failed} (after {env_args.episode_retries} retries, key 'episode_retries')")
    trajectories = [t if t.error is None else prompt_only(item, t.error) for t, item in zip(trajectories, row_items)]
    rollout = episode_rollout(trajectories, row_items, config.pad_token_id, log_prob_temperature is not None,
                              env_args.env_reward_weight if env_args.per_turn_rewards else None,
                              routing_shape(actor) if keep_experts else None)
    for record, count in zip(rollout.episodes, retries):
        record["retries"] = count
    return rollout


def prompt_only(item: Mapping, error: Optional[str] = None) -> Trajectory:
    """An episode of the prompt alone (nothing to train, reward 0): an agent's that never called, or a failed one
    (`error`)."""
    ids = list(item["input_ids"])
    return Trajectory(ids, [0] * len(ids), [0.0] * len(ids), len(ids), [], [], [], {}, error=error)


def routing_shape(actor) -> Optional[Tuple[int, int]]:
    """(sparse layers, k) of an MoE actor's routing record; None for a dense one."""
    blocks = moe_blocks(actor)
    return (len(blocks), blocks[0].settings.top_k) if blocks else None


def episode_rollout(trajectories: Sequence[Trajectory], items: Sequence[Mapping], pad_id: int,
                    with_log_probs: bool, per_turn_weight: Optional[float] = None,
                    experts_shape: Optional[Tuple[int, int]] = None) -> Rollout:
    """The trajectories (one per item) as a Rollout; per_turn_weight: set turn_rewards [N, R] (each turn's
    environment reward times the weight, on its last token); experts_shape (sparse layers, k): set experts
    [N, P + R, layers, k] from the trajectories' records (pad_trajectories)."""
    batch = pad_trajectories(trajectories, pad_id, experts_shape)
    turn_rewards = None
    if per_turn_weight is not None:
        turn_rewards = np.zeros(batch["action_mask"].shape, dtype="float32")  # [N, R]
        for i, t in enumerate(trajectories):
            for end, reward in zip(t.turn_ends, t.turn_rewards):
                turn_rewards[i, end - t.prompt_len] += per_turn_weight * reward
        turn_rewards = paddle.to_tensor(turn_rewards)
    return Rollout(
        input_ids=paddle.to_tensor(batch["input_ids"]),  # [N, P + R]
        attention_mask=paddle.to_tensor(batch["attention_mask"]),  # [N, P + R]
        response_mask=paddle.to_tensor(batch["action_mask"].astype("float32")),  # [N, R] the policy's tokens
        prompt_len=batch["prompt_len"],
        prompts=[item["prompt"] for item in items],
        completions=[final_answer(t) for t in trajectories],
        labels={"answer": [item.get("answer") for item in items]},
        old_log_probs=paddle.to_tensor(batch["log_probs"]) if with_log_probs else None,  # [N, R]
        turn_rewards=turn_rewards,
        episodes=[episode_record(t) for t in trajectories],
        experts=paddle.to_tensor(batch["experts"]) if experts_shape is not None else None)  # [N, P + R, layers, k]


def episode_record(trajectory: Trajectory) -> Dict:
    """What logs and generation files keep of an episode; `metrics`: the environment's own numbers (StepResult's
    fourth field), summed over the episode's turns; `error`: why it failed (None: it did not)."""
    return {"turns": trajectory.num_turns, "env_reward": trajectory.reward, "truncated": trajectory.truncated,
            "tool_calls": trajectory.tool_calls, "tool_errors": trajectory.tool_errors,
            "tool_time": trajectory.tool_time, "messages": trajectory.messages,
            "trajectory_tokens": len(trajectory.input_ids) - trajectory.prompt_len,
            "metrics": dict(trajectory.metrics), "error": trajectory.error}


def environment_rewards(rollout) -> np.ndarray:
    """Each row's environment reward, summed over its turns [N] (float64)."""
    return np.asarray([episode["env_reward"] for episode in rollout.episodes], dtype="float64")


ENV_MEANS = {"turns": "turns", "tool_calls": "tool_calls", "tool_errors": "tool_errors", "tool_time": "tool_time",
             "reward": "env_reward", "truncated": "truncated", "trajectory_tokens": "trajectory_tokens"}


def env_metric_names(episodes: Sequence[Mapping]) -> List[str]:
    """The names of the numbers the environments returned in StepResult.metrics, beyond ENV_MEANS."""
    return sorted({name for e in episodes for name in e.get("metrics", {})} - set(ENV_MEANS))


def episode_metrics(episodes: Sequence[Mapping], prefix: str = "env/",
                    names: Optional[Sequence[str]] = None) -> Dict[str, float]:
    """Means over episodes (episode_record's dicts) of prefix + turns, tool_calls, tool_errors, tool_time (seconds
    per episode), reward (before env_reward_weight), truncated (cut by max_turns or the token budget),
    trajectory_tokens, and prefix + name for each of `names` (default: env_metric_names): the environment's own
    numbers, each episode's sum over its turns, 0 for an episode that never returned it."""
    metrics = {prefix + name: float(np.mean([float(e[key]) for e in episodes])) for name, key in ENV_MEANS.items()}
    for name in env_metric_names(episodes) if names is None else names:
        metrics[prefix + name] = float(np.mean([float(e.get("metrics", {}).get(name, 0.0)) for e in episodes]))
    return metrics
