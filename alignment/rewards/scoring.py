"""The end reward of each rollout: the reward model's score (clipped) plus weighted reward functions
(alignment/rewards/functions.py).

When the reward model's tokenizer differs from the actor's, rollouts are decoded and re-tokenized with the
reward model's own chat template before scoring. With `server` (alignment/rewards/remote.py) the reward model's
score comes from an HTTP reward server instead (tools/reward_server.py), which computes the same thing with
`ServerScorer` below: the rollout's own tokens when the tokenizers match, the re-tokenized text otherwise.
"""
from __future__ import annotations

import dataclasses
import math
import time
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np
import paddle

from alignment.data.tokenized import attention_mask_for, pad_sequences, tokenize_conversation
from alignment.rewards.functions import function_scores, load_reward_function, prompt_text
from alignment.rewards.process import ProcessRewardScorer, is_process_reward_model
from alignment.rewards.remote import tokenizer_fingerprint  # noqa: F401  (the reward server compares them)


def same_tokenizer(a, b) -> bool:
    return a._tok.to_str() == b._tok.to_str() and a.chat_template == b.chat_template


def same_vocabulary(a, b) -> bool:
    """Whether two tokenizers give every token the same id (a draft model's tokens are the policy's ids)."""
    return a._tok.get_vocab() == b._tok.get_vocab()


def conversation_ids(tokenizer, prompts: Sequence, completions: Sequence[str]) -> List[List[int]]:
    """Each (prompt, completion) as the reward model reads it: the conversation in its own chat template."""
    return [tokenize_conversation(tokenizer, tokenizer.chat_messages(prompt) +
                                  [{"role": "assistant", "content": completion}])[0]
            for prompt, completion in zip(prompts, completions)]


def query_ids(tokenizer, query: str) -> List[int]:
    """A whole rendered conversation (OpenRLHF's `query`) as tokens, ending at its last eos as
    tokenize_conversation's answers do (an eos is appended when the text has none)."""
    ids = tokenizer.encode(query, add_special_tokens=True)
    eos = tokenizer.eos_token_id
    if eos is None:
        return ids
    if eos not in ids:
        return ids + [eos]
    return ids[: len(ids) - ids[::-1].index(eos)]


@paddle.no_grad()
def end_scores(model, ids: List[List[int]], pad_token_id: int, batch_size: int) -> np.ndarray:
    """The score model's end score [N] (float32) of each token list, right-padded in batches of batch_size."""
    model.eval()
    out = []
    for start in range(0, len(ids), batch_size):
        chunk = ids[start: start + batch_size]
        scores = model(paddle.to_tensor(pad_sequences(chunk, pad_token_id)),
                       paddle.to_tensor(attention_mask_for(chunk))).end_scores  # [b]
        out.append(scores.numpy().astype("float32"))
    return np.concatenate(out) if out else np.zeros([0], "float32")


class RewardComputer:
    def __init__(self, reward_model=None, reward_tokenizer=None, actor_tokenizer=None, funcs: List[str] = (),
                 weights: List[float] = (), clip_range_score: float = math.inf, server=None):
        self.model, self.tokenizer, self.clip, self.server = reward_model, reward_tokenizer, clip_range_score, server
        self.retokenize = reward_model is not None and not same_tokenizer(reward_tokenizer, actor_tokenizer)
        self.process = None  # a process reward model scores responses step by step (rewards/process.py)
        if reward_model is not None and is_process_reward_model(getattr(reward_model, "name_or_path", "")):
            self.process = ProcessRewardScorer(reward_model, reward_tokenizer, reward_model.name_or_path)
        self.funcs = [(spec, load_reward_function(spec)) for spec in funcs]
        self.weights = list(weights) or [1.0] * len(self.funcs)
        self.row_notes = {}

    @paddle.no_grad()
    def model_scores(self, rollout) -> paddle.Tensor:
        """Reward-model end scores [N], clipped to +/- clip_range_score."""
        if self.process is not None:
            scores = self.process.end_scores([prompt_text(p) for p in rollout.prompts], rollout.completions)
            return paddle.clip(paddle.to_tensor(scores.astype("float32")), -self.clip, self.clip)
        if self.retokenize:
            ids = conversation_ids(self.tokenizer, rollout.prompts, rollout.completions)
            input_ids = paddle.to_tensor(pad_sequences(ids, self.tokenizer.pad_token_id))
            attention_mask = paddle.to_tensor(attention_mask_for(ids))
        else:
            input_ids, attention_mask = rollout.input_ids, rollout.attention_mask
        self.model.eval()
        scores = self.model(input_ids, attention_mask).end_scores  # [N]
        return paddle.clip(scores, -self.clip, self.clip)

    def server_scores(self, rollout) -> Tuple[np.ndarray, Dict[str, float]]:
        """The reward server's scores [N] (float64), clipped as model_scores, and the call's time and retries."""
        start = time.perf_counter()
        scores, retries = self.server.scores(rollout.prompts, rollout.completions, rollout.labels.get("answer"),
                                             rollout.input_ids.numpy(), rollout.attention_mask.numpy())
        return np.clip(scores, -self.clip, self.clip), {"time/reward_server": time.perf_counter() - start,
                                                        "reward_server/retries": float(retries)}

    def __call__(self, rollout) -> Tuple[paddle.Tensor, Dict[str, float]]:
        """End rewards [N] and the mean of each part (for logging); each row's parts stay in `row_parts`
        ({part: [N] float64}, the rollout ledger's)."""
        total = np.zeros(len(rollout.completions), dtype="float64")
        parts, self.row_parts = {}, {}
        if self.server is not None:
            scores, stats = self.server_scores(rollout)
            total += scores
            parts.update({"reward/model": float(scores.mean()), **stats})
            self.row_parts["model"] = scores
        elif self.model is not None:
            scores = self.model_scores(rollout).numpy().astype("float64")
            total += scores
            parts["reward/model"] = float(scores.mean())
            self.row_parts["model"] = scores
        scores = function_scores(self.funcs, rollout.prompts, rollout.completions, rollout.labels)
        for (spec, values), weight in zip(scores.items(), self.weights):
            total += weight * values
            parts[f"reward/{spec}"] = float(values.mean())
            self.row_parts[spec] = values
        # model judges (model_judges.py): each row's judge prompt and answer, for the rollout ledger
        self.row_notes = {spec: fn.transcripts for spec, fn in self.funcs if getattr(fn, "transcripts", None)}
        return paddle.to_tensor(total.astype("float32")), parts


@dataclasses.dataclass
class ScoreRow:
    """One row a reward server scores. The model reads `query` tokenized as it stands (OpenRLHF) when given,
    else the prompt and response re-tokenized in its chat template (as RewardComputer.model_scores)."""
    prompt: object  # str or list of turns
    response: str
    label: Optional[str] = None  # the dataset's answer, for judges (`answer=`)
    query: Optional[str] = None


class ServerScorer:
    """What the reward server computes for a batch of rows: the score model's end score plus weighted judges
    (any reward function spec), summed; each part is returned too (OpenRLHF's extra_logs)."""

    def __init__(self, model=None, tokenizer=None, judges: Sequence[str] = (), weights: Sequence[float] = (),
                 max_batch: int = 32):
        if model is None and not judges:
            raise ValueError("a reward server needs --model, --judge or both")
        if weights and len(weights) != len(judges):
            raise ValueError(f"--judge-weight: {len(weights)} weights for {len(judges)} judges")
        self.model, self.tokenizer, self.max_batch = model, tokenizer, max_batch
        try:
            self.judges = [(spec, load_reward_function(spec)) for spec in judges]
        except ValueError as err:  # its message names the PPO keys; here the flag is --judge
            raise ValueError(f"--judge: {str(err).split(': ', 1)[-1]}") from None
        self.weights = list(weights) or [1.0] * len(self.judges)
        self.fingerprint = tokenizer_fingerprint(tokenizer) if tokenizer is not None else None
        self.vocab_size = tokenizer.vocab_size if tokenizer is not None else 0
        self.max_positions = model.config.max_position_embeddings if model is not None else None

    def model_ids(self, row: ScoreRow) -> List[int]:
        if row.query is not None:
            return query_ids(self.tokenizer, row.query)
        return conversation_ids(self.tokenizer, [row.prompt], [row.response])[0]

    def checked_ids(self, rows: Sequence[ScoreRow]) -> List[List[int]]:
        """Each row's tokens; a row longer than the model's positions is a ValueError (refused, not scored with
        positions the model never saw)."""
        ids = [self.model_ids(row) for row in rows]
        for i, row_ids in enumerate(ids):
            if len(row_ids) > self.max_positions:
                raise ValueError(f"row {i} is {len(row_ids)} tokens; the score model reads at most "
                                 f"{self.max_positions} positions")
        return ids

    @paddle.no_grad()
    def model_scores(self, rows: Sequence[ScoreRow], layout=None) -> np.ndarray:
        """End scores [N] float32: of `layout` (padded input_ids, attention_mask [N, W], the client's own
        tensors) in one forward pass as RewardComputer.model_scores runs them, else of the rows' tokens."""
        if layout is None:
            return end_scores(self.model, self.checked_ids(rows), self.tokenizer.pad_token_id, self.max_batch)
        self.model.eval()
        input_ids, attention_mask = (paddle.to_tensor(np.asarray(a, dtype="int64")) for a in layout)
        return self.model(input_ids, attention_mask).end_scores.numpy().astype("float32")

    def score(self, rows: Sequence[ScoreRow], layout=None) -> Tuple[np.ndarray, Dict[str, np.ndarray]]:
        """(total [N] float64, {part name: [N]}); ValueError names a row whose score is not finite."""
        total, parts = np.zeros(len(rows), "float64"), {}
        if self.model is not None:
            parts["model"] = self.model_scores(rows, layout).astype("float64")
            total += parts["model"]
        if self.judges:
            labels = {"answer": [row.label for row in rows]}
            values = function_scores(self.judges, [r.prompt for r in rows], [r.response for r in rows], labels)
            for (spec, value), weight in zip(values.items(), self.weights):
                parts[f"judge/{spec}"] = value
                total += weight * value
        bad = np.flatnonzero(~np.isfinite(total))
        if bad.size:
            raise ValueError(f"the reward model gave {total[bad[0]]} for row {int(bad[0])}")
        return total, parts
