"""The end reward of each rollout: the reward model's score (clipped) plus weighted reward functions
(alignment/rewards/functions.py).

When the reward model's tokenizer differs from the actor's, rollouts are decoded and re-tokenized with the
reward model's own chat template before scoring.
"""
from __future__ import annotations

import math
from typing import Dict, List, Tuple

import numpy as np
import paddle

from alignment.data.tokenized import attention_mask_for, pad_sequences, tokenize_conversation
from alignment.rewards.functions import function_scores, load_reward_function


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

    def __call__(self, rollout) -> Tuple[paddle.Tensor, Dict[str, float]]:
        """End rewards [N] and the mean of each part (for logging)."""
        total = np.zeros(len(rollout.completions), dtype="float64")
        parts = {}
        if self.model is not None:
            scores = self.model_scores(rollout).numpy().astype("float64")
            total += scores
            parts["reward/model"] = float(scores.mean())
        scores = function_scores(self.funcs, rollout.prompts, rollout.completions, rollout.labels)
        for (spec, values), weight in zip(scores.items(), self.weights):
            total += weight * values
            parts[f"reward/{spec}"] = float(values.mean())
        return paddle.to_tensor(total.astype("float32")), parts
