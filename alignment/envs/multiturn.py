"""Multi-turn rollouts: the policy samples a turn, its environment answers, sampling continues on the same KV
cache.

Every row is a sequence of the decode engine (models/engine.py) with its own environment. When a row's turn ends
its environment's `step` goes to a pool of `workers` threads (async environments are awaited on one event loop),
and the row pauses in its slot, cache kept; the other rows go on decoding. An `ObservationSchedule` says when
results come back: `continuous` (the default) resumes each row as soon as its observation is ready, `lockstep`
waits until every row has ended its turn and every step has answered (rounds, as a batch of lockstep episodes
plays). The engine's shapes are fixed, so both give the same bits: only the waiting differs.

The ids in a Trajectory are exactly the ids sampled, and the observation ids exactly the chat template's text for
the new messages (chat.py), encoded once: nothing the policy generated is decoded and re-encoded into the
sequence (the decoded text only goes to the environment).
"""
from __future__ import annotations

import concurrent.futures as cf
import dataclasses
from typing import Any, Dict, List, Mapping, Optional, Sequence

import numpy as np
import paddle

from alignment.envs.base import (Environment, EnvironmentFailure, Message, StepResult, checked_reset, checked_step,
                                 checked_stop_strings)
from alignment.envs.chat import continuation_ids, prompt_text
from alignment.models.engine import DecodeEngine, DecodeSequence
from alignment.models.sampling import GenerationConfig


@dataclasses.dataclass
class Trajectory:
    """One row's episode. `input_ids`, `action_mask` and `log_probs` have one entry per token."""
    input_ids: List[int]  # prompt, then every turn and observation, as sampled / rendered
    action_mask: List[int]  # 1 on tokens the policy sampled, 0 on prompt, observation and template tokens
    log_probs: List[float]  # the sampler's log p(token) on action tokens (logits / log_prob_temperature), else 0
    prompt_len: int
    turn_rewards: List[float]  # the environment's reward for each turn it stepped
    turn_ends: List[int]  # index in input_ids of each stepped turn's last token (where a per-turn reward lands)
    messages: List[Message]  # the conversation as text, for logs (training reads input_ids)
    metrics: Dict[str, float]  # StepResult metrics summed over turns: tool_calls, tool_errors, tool_time, ...
    num_turns: int = 0  # assistant turns given to the environment (a turn cut by the budget is not)
    truncated: bool = False  # ended by max_turns or the token budget rather than by the environment
    error: Optional[str] = None  # isolate_failures: the EnvironmentFailure that ended the episode
    experts: Optional[List[np.ndarray]] = None  # MoE routing replay: per fed token of input_ids (all but the last,
    # sampled and never fed), the [sparse layers, k] experts the sampler routed it to (keep_experts)

    @property
    def reward(self) -> float:
        return float(sum(self.turn_rewards))

    @property
    def tool_calls(self) -> int:
        return int(self.metrics.get("tool_calls", 0))

    @property
    def tool_errors(self) -> int:
        return int(self.metrics.get("tool_errors", 0))

    @property
    def tool_time(self) -> float:
        return float(self.metrics.get("tool_time", 0.0))


def environment_row(item: Mapping[str, Any]) -> Dict[str, Any]:
    """The dataset row an environment's reset() gets (item: a prompt dataset's item): its other columns as
    written, then input and answer."""
    sample = dict(item.get("row") or {"input": item["prompt"], "answer": item.get("answer")})
    return {**sample.pop("columns", {}), **sample}


def final_answer(trajectory: Trajectory) -> str:
    """The episode's last assistant message (what reward functions judge); "" when it has none."""
    said = [m["content"] for m in trajectory.messages if m["role"] == "assistant"]
    return said[-1] if said else ""


class ObservationSchedule:
    """When the environments' answers go back to the engine. `ready(futures, decoding)` -> the finished futures
    to apply now (it may wait for them when nothing is decoding)."""
    NAME = ""

    def ready(self, futures, decoding: bool) -> list:
        raise NotImplementedError


class Continuous(ObservationSchedule):
    """A row resumes as soon as its environment has answered."""
    NAME = "continuous"

    def ready(self, futures, decoding: bool) -> list:
        done = [f for f in futures if f.done()]
        if not done and not decoding:
            done = list(cf.wait(futures, return_when=cf.FIRST_COMPLETED).done)
        return done


class Lockstep(ObservationSchedule):
    """Rows resume together once every turn of the round has ended and every environment has answered."""
    NAME = "lockstep"

    def ready(self, futures, decoding: bool) -> list:
        return [] if decoding else list(cf.wait(futures).done)


SCHEDULES = {cls.NAME: cls for cls in (Continuous, Lockstep)}


@dataclasses.dataclass
class _Row:
    """A row's episode: its environment, engine sequence and trajectory."""
    env: Environment
    seq: DecodeSequence
    trajectory: Trajectory
    budget: int  # tokens after the prompt this row may hold
    text: str = ""  # the last turn as the environment got it
    close: str = ""  # the text of the eos token that ended it ("" for other endings)

    def response_len(self) -> int:
        return len(self.trajectory.input_ids) - self.trajectory.prompt_len


@paddle.no_grad()
def multi_turn_rollout(model, tokenizer, envs: Sequence[Environment], rows: Sequence[Mapping[str, Any]],
                       config: GenerationConfig, max_turns: int, max_total_tokens: int,
                       log_prob_temperature: float = 1.0, max_length: Optional[int] = None,
                       row_seeds: Optional[Sequence[Sequence[int]]] = None, workers: int = 16,
                       schedule: str = "continuous", isolate_failures: bool = False,
                       keep_experts: bool = False, draft=None) -> List[Trajectory]:
    """Run one episode per (environment, row) with `model` (LlamaForCausalLM) and return their Trajectories.

    config: the sampler (do_sample, temperature, top-k/p, repetition penalty, eos_token_id, pad_token_id);
    `max_new_tokens` caps each turn and `min_new_tokens` applies per turn. max_turns: assistant turns per episode.
    max_total_tokens: tokens after the prompt (sampled, observation and template tokens) per row; a turn that
    reaches it ends the episode unstepped, and an observation that does not fit (with room for one more token) is
    not appended. A turn ends at eos, at one of its environment's `stop_strings`, or at `max_new_tokens`; every
    turn but one cut by the budget is given to the environment. max_length: also keep each row's whole sequence
    (prompt and all) within this many tokens (a prompt that leaves no room is a ValueError naming the environment);
    it is then the engine's capacity, so the bits do not depend on the other rows' prompts.
    row_seeds: one seed (a list of ints) per row when sampling: each row then draws its own random numbers, one
    per token it samples, so its episode does not depend on which other rows share its batch (one process or
    several give the same trajectories); None: paddle's generator for the whole batch. workers: environment
    steps (and resets) run at once; schedule: a SCHEDULES name. isolate_failures: an EnvironmentFailure of one
    row's reset or step ends that row's episode alone (its Trajectory's `error`; one failed in reset holds no
    tokens) and the other rows go on; else it is raised. keep_experts: an MoE model's record of the experts each
    fed token was routed to goes on its Trajectory (`experts`), each token's from the forward that fed it: a turn's
    last token and the observation after it from the next turn's prefill. draft: a draft model
    (models/draft_model.DraftModel) the engine speculates with (config.num_assistant_tokens per verify forward).
    """
    if len(envs) != len(rows) or not rows:
        raise ValueError(f"multi_turn_rollout: {len(envs)} environments for {len(rows)} rows (one each, >= 1)")
    if max_turns < 1 or max_total_tokens < 1 or workers < 1:
        raise ValueError(f"multi_turn_rollout: max_turns, max_total_tokens and workers must be >= 1, got "
                         f"{max_turns}, {max_total_tokens}, {workers}")
    if row_seeds is not None and len(row_seeds) != len(rows):
        raise ValueError(f"multi_turn_rollout: {len(row_seeds)} row seeds for {len(rows)} rows")
    waiting = SCHEDULES[schedule]()
    pool = cf.ThreadPoolExecutor(max_workers=workers, thread_name_prefix="alignment-env")
    try:
        resets = [pool.submit(checked_reset, env, row) for env, row in zip(envs, rows)]  # the resets overlap too
        every = [_started(env, future, tokenizer, config, max_total_tokens, max_length, log_prob_temperature,
                          isolate_failures) for env, future in zip(envs, resets)]
        if row_seeds is not None and config.do_sample:
            for row, seed in zip(every, row_seeds):
                if not isinstance(row, Trajectory):
                    row.seq.rng = np.random.default_rng(list(seed))
        batch = [row for row in every if not isinstance(row, Trajectory)]
        if not batch:  # every reset failed
            return every
        capacity = max_length or max(len(r.trajectory.input_ids) + r.budget for r in batch)
        engine = DecodeEngine(model, len(batch), capacity, draft=draft)
        by_seq = {}
        for row in batch:
            engine.add(row.seq)
            by_seq[id(row.seq)] = row
        futures: Dict[cf.Future, _Row] = {}
        while engine.busy() or futures:
            for seq in engine.step() if engine.busy() else []:
                row = by_seq[id(seq)]
                text = _record_turn(row, tokenizer)
                if text is None:
                    engine.release(seq)
                else:
                    futures[pool.submit(checked_step, row.env, text)] = row
            for future in waiting.ready(list(futures), engine.busy()) if futures else []:
                row = futures.pop(future)
                try:
                    observation = _apply_step(row, future.result(), tokenizer, max_turns)
                except EnvironmentFailure as err:
                    if not isolate_failures:
                        raise
                    row.trajectory.error, observation = str(err), None
                if observation is None:
                    engine.release(row.seq)
                else:
                    engine.resume(row.seq, observation)
        for row in batch if keep_experts and engine.routing else ():
            row.trajectory.experts = list(row.seq.experts)  # one per token of input_ids but the last
    finally:
        pool.shutdown(wait=False, cancel_futures=True)
    return [row if isinstance(row, Trajectory) else row.trajectory for row in every]


def _started(env: Environment, reset: cf.Future, tokenizer, config: GenerationConfig, max_total_tokens: int,
             max_length: Optional[int], log_prob_temperature: float, isolate_failures: bool):
    """The row's _Row once its reset has answered; with isolate_failures, a reset (or stop_strings) that failed
    is an empty Trajectory holding the error."""
    try:
        return _start(env, reset.result(), tokenizer, config, max_total_tokens, max_length, log_prob_temperature)
    except EnvironmentFailure as err:
        if not isolate_failures:
            raise
        return Trajectory([], [], [], 0, [], [], [], {}, error=str(err))


def _start(env: Environment, messages: List[Message], tokenizer, config: GenerationConfig, max_total_tokens: int,
           max_length: Optional[int], log_prob_temperature: float) -> _Row:
    ids = tokenizer.encode(prompt_text(tokenizer, messages), add_special_tokens=True)
    budget = max_total_tokens if max_length is None else min(max_total_tokens, max_length - len(ids))
    if budget < 1:
        raise ValueError(f"environment {env.env_name!r}: its first messages are {len(ids)} tokens, which leaves no "
                         f"room for an answer within max_length {max_length}")
    trajectory = Trajectory(list(ids), [0] * len(ids), [0.0] * len(ids), len(ids), [], [], messages, {})
    stops = checked_stop_strings(env)
    stop = (lambda turn: _ends_with_stop(turn, stops, tokenizer)) if stops else None
    seq = DecodeSequence(ids, config, len(ids) + budget, stop=stop, log_prob_temperature=log_prob_temperature)
    return _Row(env, seq, trajectory, budget)


def _ends_with_stop(turn: List[int], stops: Sequence[str], tokenizer) -> bool:
    """Whether the turn's newest tokens hold a stop string (checked after every token, so one that does ends in the
    newest token; a token is at least one character, so the last len(stop) + 1 tokens hold it)."""
    tail = tokenizer.decode(turn[-(max(len(stop) for stop in stops) + 1):], skip_special_tokens=False)
    return any(stop in tail for stop in stops)


def _record_turn(row: _Row, tokenizer) -> Optional[str]:
    """Append the turn's tokens to the trajectory; -> the text the environment gets, None when the budget cut the
    turn (the environment never sees a partial turn: the episode ends)."""
    seq, trajectory = row.seq, row.trajectory
    trajectory.input_ids.extend(seq.turn)
    trajectory.action_mask.extend([1] * len(seq.turn))
    trajectory.log_probs.extend(seq.turn_log_probs)
    if seq.ending == "budget":
        trajectory.truncated = True
        return None
    close = tokenizer.decode(seq.turn[-1:], skip_special_tokens=False) if seq.ending == "eos" else ""
    text = tokenizer.decode(seq.turn, skip_special_tokens=False)
    row.text, row.close = (text[: len(text) - len(close)] if close and text.endswith(close) else text), close
    return row.text


def _apply_step(row: _Row, result: StepResult, tokenizer, max_turns: int) -> Optional[List[int]]:
    """Record the environment's answer; -> the observation ids to feed, None when the episode is over."""
    trajectory = row.trajectory
    trajectory.num_turns += 1
    trajectory.turn_rewards.append(result.reward)
    trajectory.turn_ends.append(len(trajectory.input_ids) - 1)
    for key, value in result.metrics.items():
        trajectory.metrics[key] = trajectory.metrics.get(key, 0.0) + float(value)
    history = trajectory.messages + [{"role": "assistant", "content": row.text}]
    trajectory.messages = history + result.observation
    if result.done or trajectory.num_turns >= max_turns:
        trajectory.truncated = not result.done
        return None
    observation = continuation_ids(tokenizer, history, result.observation, row.close)
    if row.response_len() + len(observation) + 1 > row.budget:
        trajectory.truncated = True
        return None
    trajectory.input_ids.extend(observation)
    trajectory.action_mask.extend([0] * len(observation))
    trajectory.log_probs.extend([0.0] * len(observation))
    return observation


def pad_trajectories(trajectories: Sequence[Trajectory], pad_id: int,
                     experts_shape: Optional[Sequence[int]] = None) -> Dict[str, Any]:
    """Trajectories as one batch in the single-turn rollout layout (prompts left-padded to the widest P, what
    follows right-padded to the longest R): numpy arrays input_ids, attention_mask [N, P + R]; response_mask
    [N, R] (1 on every token after the prompt: turns, observations, template text), action_mask and log_probs
    [N, R] (the policy's tokens only); prompt_len P. experts_shape (sparse layers, k): also experts
    [N, P + R, layers, k], each Trajectory's record in its tokens' columns, -1 where none is (padding, the last
    token, an episode without a record)."""
    width_p = max(t.prompt_len for t in trajectories)
    width_r = max(1, max(len(t.input_ids) - t.prompt_len for t in trajectories))
    n = len(trajectories)
    out = {"input_ids": np.full([n, width_p + width_r], pad_id, dtype="int64"),
           "attention_mask": np.zeros([n, width_p + width_r], dtype="int64"),
           "response_mask": np.zeros([n, width_r], dtype="int64"), "action_mask": np.zeros([n, width_r], "int64"),
           "log_probs": np.zeros([n, width_r], dtype="float32"), "prompt_len": width_p}
    for i, t in enumerate(trajectories):
        p, r = t.prompt_len, len(t.input_ids) - t.prompt_len
        out["input_ids"][i, width_p - p: width_p + r] = t.input_ids
        out["attention_mask"][i, width_p - p: width_p + r] = 1
        out["response_mask"][i, :r] = 1
        out["action_mask"][i, :r] = t.action_mask[p:]
        out["log_probs"][i, :r] = t.log_probs[p:]
    if experts_shape is not None:
        out["experts"] = np.full([n, width_p + width_r, *experts_shape], -1, dtype="int64")
        for i, t in enumerate(trajectories):
            record = (t.experts or [])[: len(t.input_ids)]  # an episode cut mid-turn (a failure) fed more
            if record:
                start = width_p - t.prompt_len
                out["experts"][i, start: start + len(record)] = np.stack(record)
    return out
