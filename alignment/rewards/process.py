"""Process reward models (PRM): a causal LM that, after each step of a solution followed by a placeholder token,
predicts one of two reward tokens (a correct step: the first, e.g. "+"; a wrong one: the second, "-"), as
Math-Shepherd (Wang et al. 2024, arXiv 2312.08935) and PaddleNLP's `process_reward` train it.

Steps are tokenized one by one, each followed by the placeholder's tokens; the step's score is read at the
placeholder's last token: p(good) = softmax([logit good, logit bad])[0]. In PPO / GRPO a PRM scores a response cut
into steps at line breaks, and the end reward is the lowest step's p(good) (the "min" aggregation of Lightman et
al. 2023 and Math-Shepherd); PRIME's implicit dense process rewards are not built.
"""
from __future__ import annotations

import json
import os
from typing import List, NamedTuple, Sequence, Tuple

import numpy as np
import paddle

from alignment.inputs import TEXT, check_keys, read_json

SETTINGS_FILE = "process_reward.json"  # beside a trained PRM's weights: its placeholder and reward tokens


class StepTokens(NamedTuple):
    placeholder: List[int]  # the placeholder text's token ids
    good: int  # the id of the reward token of a correct step
    bad: int


def step_tokens(tokenizer, placeholder: str, reward_tokens: str) -> StepTokens:
    """The placeholder's ids and the two reward tokens' ids; ValueError naming the key when they do not fit."""
    parts = [part for part in reward_tokens.split(",")]
    if len(parts) != 2 or not all(parts):
        raise ValueError(f"key 'reward_tokens' must name two tokens as 'good,bad' (e.g. '+,-'), got {reward_tokens!r}")
    ids = [tokenizer.encode(part, add_special_tokens=False) for part in parts]
    if any(len(i) != 1 for i in ids) or ids[0] == ids[1]:
        raise ValueError(f"key 'reward_tokens': {parts} must be two different single tokens of the tokenizer, got "
                         f"ids {ids}")
    placeholder_ids = tokenizer.encode(placeholder, add_special_tokens=False)
    if not placeholder_ids:
        raise ValueError(f"key 'placeholder_token' {placeholder!r} has no tokens")
    return StepTokens(placeholder_ids, ids[0][0], ids[1][0])


def step_ids(tokenizer, prompt: str, steps: Sequence[str], tokens: StepTokens, max_length: int
             ) -> Tuple[List[int], List[int]]:
    """(ids, positions): the prompt, then each step and the placeholder; positions [k] of the placeholders' last
    tokens. Steps that do not fit in max_length are left out."""
    ids = tokenizer.encode(prompt, add_special_tokens=True) if prompt else \
        tokenizer.encode("", add_special_tokens=True)
    positions = []
    for step in steps:
        piece = tokenizer.encode(step, add_special_tokens=False) + tokens.placeholder
        if len(ids) + len(piece) > max_length:
            break
        ids += piece
        positions.append(len(ids) - 1)
    return ids, positions


def step_logits(model, input_ids, attention_mask, positions, tokens: StepTokens):
    """[k, 2] logits (good, bad) at the flat positions [k, 2] (row, column) of the batch."""
    hidden, _ = model.model(input_ids, attention_mask=attention_mask)  # [b, s, h]
    states = paddle.gather_nd(hidden, positions)  # [k, h]
    logits = model.compute_logits(states)  # [k, vocab]
    return paddle.stack([logits[:, tokens.good], logits[:, tokens.bad]], axis=1)  # [k, 2]


def save_settings(directory: str, placeholder: str, reward_tokens: str) -> None:
    with open(os.path.join(directory, SETTINGS_FILE), "w", encoding="utf-8") as f:
        json.dump({"placeholder_token": placeholder, "reward_tokens": reward_tokens}, f)


def is_process_reward_model(directory: str) -> bool:
    return bool(directory) and os.path.isfile(os.path.join(directory, SETTINGS_FILE))


class ProcessRewardScorer:
    """A trained PRM scoring PPO responses: the lowest step's p(good), steps cut at line breaks."""

    def __init__(self, model, tokenizer, directory: str, max_length: int = 4096):
        file = os.path.join(directory, SETTINGS_FILE)
        settings = check_keys(read_json(file, "process reward settings"), {"placeholder_token": TEXT,
                              "reward_tokens": TEXT}, file, required=("placeholder_token", "reward_tokens"))
        self.model, self.tokenizer, self.max_length = model, tokenizer, max_length
        self.tokens = step_tokens(tokenizer, settings["placeholder_token"], settings["reward_tokens"])

    @paddle.no_grad()
    def end_scores(self, prompts: Sequence[str], completions: Sequence[str]) -> np.ndarray:
        """[N] float64: min over each response's steps of p(good); 0.5 for a response with no step that fits."""
        self.model.eval()
        out = np.full(len(completions), 0.5, dtype="float64")
        rows = [step_ids(self.tokenizer, prompt, [line for line in completion.split("\n") if line.strip()],
                         self.tokens, self.max_length) for prompt, completion in zip(prompts, completions)]
        scored = [i for i, (_, positions) in enumerate(rows) if positions]
        if not scored:
            return out
        ids = [rows[i][0] for i in scored]  # one right-padded forward for every response with a step
        width = max(len(row) for row in ids)
        input_ids = paddle.to_tensor([row + [0] * (width - len(row)) for row in ids], dtype="int64")
        mask = paddle.to_tensor([[1] * len(row) + [0] * (width - len(row)) for row in ids], dtype="int64")
        positions = [[b, p] for b, i in enumerate(scored) for p in rows[i][1]]
        good = paddle.nn.functional.softmax(step_logits(self.model, input_ids, mask, paddle.to_tensor(positions),
                                                        self.tokens), axis=-1)[:, 0].numpy()  # [k]
        start = 0
        for i in scored:
            count = len(rows[i][1])
            out[i] = float(good[start: start + count].min())
            start += count
        return out
