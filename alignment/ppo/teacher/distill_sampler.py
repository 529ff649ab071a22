"""GKD's data mix (Agarwal et al. 2024, arXiv 2306.13649, algorithm 1; TRL GKDTrainer.training_step): a step is
on-policy with probability `lmbda` (the student samples, as always), else it trains on the dataset's answers
(or, with `seq_kd`, on answers the teacher samples). The draw is decided by the step's generation seed, so every
rank and a resumed run make the same choice. Evaluation (greedy draws) always samples the student."""
from __future__ import annotations

from typing import List

import numpy as np
import paddle

from alignment.data.tokenized import pad_sequences
from alignment.models.weights_digest import weights_digest
from alignment.ppo.rollout.rollout import Rollout
from alignment.ppo.asynchronous.weight_check import OFF_POLICY, stamp


def on_policy(seed: int, lmbda: float) -> bool:
    return lmbda >= 1 or float(np.random.default_rng([seed, 54]).random()) < lmbda


def answer_ids(tokenizer, items, eos_id: int, budget: int) -> List[List[int]]:
    """Each item's dataset answer as tokens ending in eos, at most `budget`; ValueError names a row without one."""
    out = []
    for row, item in enumerate(items):
        answer = item.get("answer")
        if not isinstance(answer, str) or not answer.strip():
            raise ValueError(f"key 'lmbda' < 1 trains on the dataset's answers: prompt row {row} "
                             f"({str(item.get('prompt'))[:60]!r}) has none")
        out.append((tokenizer.encode(answer, add_special_tokens=False) + [eos_id])[:budget])
    return out


def dataset_rollout(items, n: int, tokenizer, collate, eos_id: int, budget: int) -> Rollout:
    """The items' dataset answers laid out as a sampled rollout (n identical rows per item)."""
    items = [item for item in items for _ in range(n)]
    batch = collate(items)
    answers = answer_ids(tokenizer, items, eos_id, budget)
    response = pad_sequences(answers, tokenizer.pad_token_id)  # [N, R] right-padded
    response_mask = np.zeros(response.shape, "int64")
    for row, ids in enumerate(answers):
        response_mask[row, : len(ids)] = 1
    prompt_ids, prompt_mask = np.asarray(batch["input_ids"]), np.asarray(batch["attention_mask"])  # [N, P]
    return Rollout(input_ids=paddle.to_tensor(np.concatenate([prompt_ids, response], axis=1).astype("int64")),
                   attention_mask=paddle.to_tensor(np.concatenate([prompt_mask, response_mask], axis=1)
                                                   .astype("int64")),
                   response_mask=paddle.to_tensor(response_mask.astype("float32")), prompt_len=prompt_ids.shape[1],
                   prompts=[item["prompt"] for item in items], completions=[item["answer"] for item in items],
                   labels={"answer": [item.get("answer") for item in items]})


class MixedSampler:
    """Wraps the trainer's sampler (samplers.py): on-policy steps call it with the student, the others lay out
    the dataset's answers, or call it with the teacher model (seq_kd)."""

    def __init__(self, inner, distill_args, teacher_model, max_length: int, max_new_tokens):
        self.inner, self.args, self.teacher_model = inner, distill_args, teacher_model
        self.max_length, self.max_new_tokens = max_length, max_new_tokens
        self.last_on_policy = True
        self.teacher_digest = None  # the frozen teacher's weights digest, taken once

    def __call__(self, actor, tokenizer, base, draw):
        self.last_on_policy = draw.greedy or on_policy(draw.seed, self.args.lmbda)
        if self.last_on_policy:
            return self.inner(actor, tokenizer, base, draw)
        if self.args.seq_kd:
            draw.log_prob_temperature = None  # the teacher's sampling log-probs are not the student's
            rollout = self.inner(self.teacher_model, tokenizer, base, draw)
            self.teacher_digest = self.teacher_digest or weights_digest(self.teacher_model)
            stamp(rollout, f"{OFF_POLICY}teacher:{self.teacher_digest}", "the teacher (seq_kd)")
            return rollout
        eos = base.eos_token_id[0] if isinstance(base.eos_token_id, (list, tuple)) else base.eos_token_id
        budget = self.max_length - max(len(item["input_ids"]) for item in draw.items)
        rollout = dataset_rollout(draw.items, draw.n, tokenizer, self.inner.collate, eos,
                                  min(budget, self.max_new_tokens or budget))
        stamp(rollout, f"{OFF_POLICY}dataset", "the dataset's answers (lmbda)")
        return rollout

    def metrics(self, rollout) -> dict:
        return {**self.inner.metrics(rollout), "distill/on_policy": float(self.last_on_policy)}
