"""Multi-turn rollouts: the policy samples a turn, its environment answers, sampling continues on the same KV
cache.

One batch, one row per environment. A round is: every row samples its turn (one token per step for the whole
batch; a row whose turn has ended feeds masked padding until the longest turn of the round is over), then each
environment steps, then the new tokens of the rows that go on (the turn's last token, the observation and the
next generation prompt) are prefilled into the cache in one forward, left-padded within that block. Rows whose
episode ended leave the batch: their cache rows are dropped, and cache columns no remaining row attends to are
cut, so they cost nothing afterwards. Positions are tracked per row, so padding never shifts RoPE.

The ids in a Trajectory are exactly the ids sampled, and the observation ids exactly the chat template's text for
the new messages (chat.py), encoded once: nothing the policy generated is decoded and re-encoded into the
sequence (the decoded text only goes to the environment).
"""
from __future__ import annotations

import dataclasses
from typing import Any, Dict, List, Mapping, Optional, Sequence

import numpy as np
import paddle

from alignment.envs.base import Environment, Message, checked_reset, checked_step, checked_stop_strings
from alignment.envs.chat import continuation_ids, prompt_text
from alignment.models.generation import GenerationConfig, block_tokens, mark_seen, next_token, token_log_prob


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


@dataclasses.dataclass
class _Row:
    """A row's running state; `pending` holds its ids that are in the sequence but not yet in the cache."""
    env: Environment
    stops: Sequence[str]
    trajectory: Trajectory
    pending: List[int]
    budget: int  # tokens after the prompt this row may hold
    rng: Optional[np.random.Generator] = None  # its own random numbers (row_seeds), else the batch's
    position: int = 0  # RoPE position of the next token fed
    turn: List[int] = dataclasses.field(default_factory=list)
    ending: Optional[str] = None  # why the current turn ended: eos, stop, length, budget
    finished: bool = False

    def response_len(self) -> int:
        return len(self.trajectory.input_ids) - self.trajectory.prompt_len


@paddle.no_grad()
def multi_turn_rollout(model, tokenizer, envs: Sequence[Environment], rows: Sequence[Mapping[str, Any]],
                       config: GenerationConfig, max_turns: int, max_total_tokens: int,
                       log_prob_temperature: float = 1.0, max_length: Optional[int] = None,
                       row_seeds: Optional[Sequence[Sequence[int]]] = None) -> List[Trajectory]:
    """Run one episode per (environment, row) with `model` (LlamaForCausalLM) and return their Trajectories.

    config: the sampler (do_sample, temperature, top-k/p, repetition penalty, eos_token_id, pad_token_id);
    `max_new_tokens` caps each turn and `min_new_tokens` applies per turn. max_turns: assistant turns per episode.
    max_total_tokens: tokens after the prompt (sampled, observation and template tokens) per row; a turn that
    reaches it ends the episode unstepped, and an observation that does not fit (with room for one more token) is
    not appended. A turn ends at eos, at one of its environment's `stop_strings`, or at `max_new_tokens`; every
    turn but one cut by the budget is given to the environment. max_length: also keep each row's whole sequence
    (prompt and all) within this many tokens (a prompt that leaves no room is a ValueError naming the environment).
    row_seeds: one seed (a list of ints) per row when sampling: each row then draws its own random numbers, one
    per token it samples, so its episode does not depend on which other rows share its batch (one process or
    several give the same trajectories); None: paddle's generator for the whole batch.
    """
    if len(envs) != len(rows) or not rows:
        raise ValueError(f"multi_turn_rollout: {len(envs)} environments for {len(rows)} rows (one each, >= 1)")
    if max_turns < 1 or max_total_tokens < 1:
        raise ValueError(f"multi_turn_rollout: max_turns and max_total_tokens must be >= 1, got {max_turns}, "
                         f"{max_total_tokens}")
    if row_seeds is not None and len(row_seeds) != len(rows):
        raise ValueError(f"multi_turn_rollout: {len(row_seeds)} row seeds for {len(rows)} rows")
    eos = set(config.eos_ids)
    batch = [_start(env, row, tokenizer, max_total_tokens, max_length) for env, row in zip(envs, rows)]
    if row_seeds is not None and config.do_sample:
        for row, seed in zip(batch, row_seeds):
            row.rng = np.random.default_rng(list(seed))
    trajectories = [row.trajectory for row in batch]
    state = _Cache(model, config)
    logits = state.feed(batch)
    while batch:
        _sample_turn(state, logits, batch, config, eos, log_prob_temperature, tokenizer)
        for row in batch:
            _end_turn(row, tokenizer, max_turns)
        keep = [i for i, row in enumerate(batch) if not row.finished]
        batch = [batch[i] for i in keep]
        if batch:
            state.keep_rows(keep)
            logits = state.feed(batch)
    return trajectories


def _start(env: Environment, row: Mapping[str, Any], tokenizer, max_total_tokens: int,
           max_length: Optional[int]) -> _Row:
    messages = checked_reset(env, row)
    ids = tokenizer.encode(prompt_text(tokenizer, messages), add_special_tokens=True)
    budget = max_total_tokens if max_length is None else min(max_total_tokens, max_length - len(ids))
    if budget < 1:
        raise ValueError(f"environment {env.env_name!r}: its first messages are {len(ids)} tokens, which leaves no "
                         f"room for an answer within max_length {max_length}")
    trajectory = Trajectory(list(ids), [0] * len(ids), [0.0] * len(ids), len(ids), [], [], messages, {})
    return _Row(env, checked_stop_strings(env), trajectory, list(ids), budget)


def _sample_turn(state, logits, batch: List[_Row], config: GenerationConfig, eos: set, temperature: float,
                 tokenizer) -> None:
    """Sample one turn for every row of the batch; feed each token but the turn's last ones into the cache."""
    for row in batch:
        row.turn, row.ending = [], None
    for step in range(config.max_new_tokens):
        raw = logits  # [b, vocab]
        if step < config.min_new_tokens:
            logits = block_tokens(logits, config.eos_ids)
        uniform = None
        if batch[0].rng is not None:  # a row whose turn is over draws nothing (its number is never used)
            uniform = paddle.to_tensor([row.rng.random() if row.ending is None else 0.0 for row in batch],
                                       dtype="float32")  # [b]
        tokens = next_token(logits, config, state.seen, uniform=uniform)  # [b]
        log_probs = token_log_prob(raw, tokens, temperature).numpy()  # [b]
        for i, (row, token) in enumerate(zip(batch, tokens.numpy().tolist())):
            if row.ending is None:
                _append(row, token, float(log_probs[i]))
                row.ending = _turn_end(row, token, eos, config.max_new_tokens, tokenizer)
        if all(row.ending is not None for row in batch):
            return
        logits = state.feed(batch)


def _append(row: _Row, token: int, log_prob: float) -> None:
    trajectory = row.trajectory
    trajectory.input_ids.append(token)
    trajectory.action_mask.append(1)
    trajectory.log_probs.append(log_prob)
    row.turn.append(token)
    row.pending.append(token)


def _turn_end(row: _Row, token: int, eos: set, max_new_tokens: int, tokenizer) -> Optional[str]:
    if token in eos:
        return "eos"
    if row.stops and _ends_with_stop(row.turn, row.stops, tokenizer):
        return "stop"
    if row.response_len() >= row.budget:
        return "budget"
    return "length" if len(row.turn) >= max_new_tokens else None


def _ends_with_stop(turn: List[int], stops: Sequence[str], tokenizer) -> bool:
    """Whether the turn's newest tokens hold a stop string (checked after every token, so one that does ends in the
    newest token; a token is at least one character, so the last len(stop) + 1 tokens hold it)."""
    tail = tokenizer.decode(turn[-(max(len(stop) for stop in stops) + 1):], skip_special_tokens=False)
    return any(stop in tail for stop in stops)


def _end_turn(row: _Row, tokenizer, max_turns: int) -> None:
    """Give the turn to the environment; append its observation, or finish the row."""
    trajectory = row.trajectory
    if row.ending == "budget":  # cut mid-turn: the environment never sees a partial turn
        row.finished = trajectory.truncated = True
        return
    close = tokenizer.decode(row.turn[-1:], skip_special_tokens=False) if row.ending == "eos" else ""
    text = tokenizer.decode(row.turn, skip_special_tokens=False)
    text = text[: len(text) - len(close)] if close and text.endswith(close) else text
    result = checked_step(row.env, text)
    trajectory.num_turns += 1
    trajectory.turn_rewards.append(result.reward)
    trajectory.turn_ends.append(len(trajectory.input_ids) - 1)
    for key, value in result.metrics.items():
        trajectory.metrics[key] = trajectory.metrics.get(key, 0.0) + float(value)
    history = trajectory.messages + [{"role": "assistant", "content": text}]
    trajectory.messages = history + result.observation
    if result.done:
        row.finished = True
        return
    if trajectory.num_turns >= max_turns:
        row.finished = trajectory.truncated = True
        return
    observation = continuation_ids(tokenizer, history, result.observation, close)
    if row.response_len() + len(observation) + 1 > row.budget:
        row.finished = trajectory.truncated = True
        return
    trajectory.input_ids.extend(observation)
    trajectory.action_mask.extend([0] * len(observation))
    trajectory.log_probs.extend([0.0] * len(observation))
    row.pending.extend(observation)


def pad_trajectories(trajectories: Sequence[Trajectory], pad_id: int) -> Dict[str, Any]:
    """Trajectories as one batch in the single-turn rollout layout (prompts left-padded to the widest P, what
    follows right-padded to the longest R): numpy arrays input_ids, attention_mask [N, P + R]; response_mask
    [N, R] (1 on every token after the prompt: turns, observations, template text), action_mask and log_probs
    [N, R] (the policy's tokens only); prompt_len P."""
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
    return out


class _Cache:
    """The batch's KV cache, its attention mask [b, t] and the repetition-penalty `seen` set [b, vocab]."""

    def __init__(self, model, config: GenerationConfig):
        self.model, self.config = model, config
        self.past = None  # per layer (k, v), each [b, kv_heads, t, d]
        self.mask = None  # [b, t] int64
        self.seen = None  # [b, vocab] bool

    def feed(self, batch: List[_Row]):
        """Prefill every row's pending ids (left-padded in one block) -> logits [b, vocab] after each row's last
        one (garbage for a row with nothing pending, which samples nothing from them)."""
        width = max(1, max(len(row.pending) for row in batch))
        ids = np.full([len(batch), width], self.config.pad_token_id, dtype="int64")  # [b, width]
        new_mask = np.zeros([len(batch), width], dtype="int64")
        positions = np.zeros([len(batch), width], dtype="int64")
        for i, row in enumerate(batch):
            n = len(row.pending)
            if n:
                ids[i, width - n:], new_mask[i, width - n:] = row.pending, 1
                positions[i, width - n:] = row.position + np.arange(n)
            row.position += n
            row.pending = []
        ids_t, new_mask_t = paddle.to_tensor(ids), paddle.to_tensor(new_mask)
        self.mask = new_mask_t if self.mask is None else paddle.concat([self.mask, new_mask_t], axis=1)
        out = self.model(ids_t, attention_mask=self.mask, position_ids=paddle.to_tensor(positions),
                         past_key_values=self.past, use_cache=True, last_only=True)
        self.past = out.past_key_values
        if self.config.repetition_penalty != 1.0:
            if self.seen is None:
                self.seen = paddle.zeros([len(batch), self.model.config.vocab_size], dtype="bool")
            self.seen = mark_seen(self.seen, ids_t, new_mask_t)
        return out.logits[:, -1]

    def keep_rows(self, keep: List[int]) -> None:
        """Drop the rows not in `keep`, then the cache columns no kept row attends to."""
        index = paddle.to_tensor(np.asarray(keep, dtype="int64"))
        self.mask = paddle.gather(self.mask, index)
        columns = np.flatnonzero(self.mask.numpy().any(axis=0))
        column_index = paddle.to_tensor(columns.astype("int64"))
        cut = len(columns) < self.mask.shape[1]
        if cut:
            self.mask = paddle.gather(self.mask, column_index, axis=1)
        self.past = [tuple(_keep(x, index, column_index if cut else None) for x in layer) for layer in self.past]
        if self.seen is not None:
            self.seen = paddle.gather(self.seen, index)


def _keep(x, rows, columns):
    """x [b, kv_heads, t, d] -> the rows `rows` and (when given) the columns `columns` of t."""
    x = paddle.gather(x, rows)
    return x if columns is None else paddle.gather(x, columns, axis=2)
