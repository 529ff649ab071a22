"""The end reward of each rollout: the reward model's score (clipped) plus weighted reward functions.

A reward function is `fn(prompts, completions, **labels) -> list[float]` (one float per completion; labels are
dataset columns such as `answer`). `reward_funcs` entries name a judge in alignment.judges (`arithmetic`,
`sentiment`, ...), a `module:function`, or a `path/to/file.py:function`.
When the reward model's tokenizer differs from the actor's, rollouts are decoded and re-tokenized with the
reward model's own chat template before scoring.
"""
from __future__ import annotations

import importlib
import math
from typing import Callable, Dict, List, Optional, Tuple

import numpy as np
import paddle

from alignment.data.raw import import_user_module
from alignment.data.tokenized import pad_sequences, attention_mask_for, tokenize_conversation
from alignment.judges import JUDGES, get_judge


class RewardFunctionError(ValueError):
    """A reward function raised, or returned something other than one finite float per completion."""


def load_reward_function(spec: str) -> Callable:
    if spec in JUDGES:
        return get_judge(spec)
    if ":" not in spec:
        raise ValueError(f"key 'reward_funcs' / 'gold_judge': {spec!r} is neither a judge ({', '.join(sorted(JUDGES))}) nor "
                         "'module:function' / 'file.py:function'")
    target, name = spec.rsplit(":", 1)
    try:
        module = import_user_module(target) if target.endswith(".py") else importlib.import_module(target)
    except (ImportError, FileNotFoundError) as err:
        raise ValueError(f"key 'reward_funcs' / 'gold_judge': cannot import {target!r} ({err})") from err
    fn = getattr(module, name, None)
    if not callable(fn):
        raise ValueError(f"key 'reward_funcs' / 'gold_judge': {target!r} has no function {name!r}")
    return fn


def prompt_text(prompt) -> str:
    """Reward functions see the prompt as text; a multi-turn prompt is its turns joined by blank lines."""
    return prompt if isinstance(prompt, str) else "\n\n".join(prompt)


def same_tokenizer(a, b) -> bool:
    return a._tok.to_str() == b._tok.to_str() and a.chat_template == b.chat_template


class RewardComputer:
    def __init__(self, reward_model=None, reward_tokenizer=None, actor_tokenizer=None, funcs: List[str] = (),
                 weights: List[float] = (), clip_range_score: float = math.inf):
        self.model, self.tokenizer, self.clip = reward_model, reward_tokenizer, clip_range_score
        self.retokenize = reward_model is not None and not same_tokenizer(reward_tokenizer, actor_tokenizer)
        self.funcs = [(spec, load_reward_function(spec)) for spec in funcs]
        self.weights = list(weights) or [1.0] * len(self.funcs)

    @paddle.no_grad()
    def model_scores(self, rollout) -> paddle.Tensor:
        """Reward-model end scores [N], clipped to +/- clip_range_score."""
        if self.retokenize:
            ids = [tokenize_conversation(self.tokenizer, self.tokenizer.chat_messages(prompt) +
                                         [{"role": "assistant", "content": completion}])[0]
                   for prompt, completion in zip(rollout.prompts, rollout.completions)]
            input_ids = paddle.to_tensor(pad_sequences(ids, self.tokenizer.pad_token_id))
            attention_mask = paddle.to_tensor(attention_mask_for(ids))
        else:
            input_ids, attention_mask = rollout.input_ids, rollout.attention_mask
        self.model.eval()
        scores = self.model(input_ids, attention_mask).end_scores  # [N]
        return paddle.clip(scores, -self.clip, self.clip)

    def function_scores(self, prompts, completions, labels) -> Dict[str, np.ndarray]:
        texts = [prompt_text(p) for p in prompts]
        out = {}
        for spec, fn in self.funcs:
            try:
                values = fn(texts, list(completions), **labels)
            except Exception as err:  # a user function's bug: name it, do not hide the cause
                raise RewardFunctionError(f"reward function {spec!r} raised {type(err).__name__}: {err}") from err
            values = np.asarray(values, dtype="float64")
            if values.shape != (len(completions),):
                raise RewardFunctionError(f"reward function {spec!r} returned "
                                          f"{values.shape[0] if values.ndim else 'a scalar'} "
                                 f"values for {len(completions)} completions")
            bad = np.flatnonzero(~np.isfinite(values))
            if bad.size:
                i = int(bad[0])
                raise RewardFunctionError(f"reward function {spec!r} returned {values[i]} for sample {i} "
                                 f"(prompt {texts[i][:60]!r}, completion {completions[i][:60]!r})")
            out[spec] = values
        return out

    def __call__(self, rollout) -> Tuple[paddle.Tensor, Dict[str, float]]:
        """End rewards [N] and the mean of each part (for logging)."""
        total = np.zeros(len(rollout.completions), dtype="float64")
        parts = {}
        if self.model is not None:
            scores = self.model_scores(rollout).numpy().astype("float64")
            total += scores
            parts["reward/model"] = float(scores.mean())
        for (spec, values), weight in zip(self.function_scores(rollout.prompts, rollout.completions,
                                                               rollout.labels).items(), self.weights):
            total += weight * values
            parts[f"reward/{spec}"] = float(values.mean())
        return paddle.to_tensor(total.astype("float32")), parts


def gold_scores(judge: Optional[str], prompts, completions, labels) -> Optional[np.ndarray]:
    """The offline judge's scores (never trained on), or None when no judge is configured."""
    if judge is None:
        return None
    fn = load_reward_function(judge)
    return np.asarray(fn([prompt_text(p) for p in prompts], list(completions), **labels), dtype="float64")
