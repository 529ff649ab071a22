"""Supervised fine-tuning: next-token cross-entropy on answer tokens only."""
from __future__ import annotations

import paddle

from alignment.data.tokenized import IGNORE_INDEX
from alignment.training.trainer import Trainer


def answer_token_loss(model, input_ids, attention_mask, labels):
    """Mean cross-entropy over label tokens; the LM head runs only on those positions.

    input_ids, attention_mask, labels: [b, s] (labels = IGNORE_INDEX on prompt and padding).
    Returns (loss scalar, number of label tokens).
    """
    hidden, _ = model.model(input_ids, attention_mask=attention_mask)  # [b, s, h]
    targets = labels[:, 1:].reshape([-1])  # [b * (s-1)]: token t+1 is predicted at position t
    keep = paddle.nonzero(targets != IGNORE_INDEX).squeeze(-1)  # [n]
    states = paddle.gather(hidden[:, :-1].reshape([-1, hidden.shape[-1]]), keep)  # [n, h]
    log_probs, _ = model.token_log_probs(states, paddle.gather(targets, keep))  # [n]
    return -log_probs.mean(), int(keep.shape[0])


class SupervisedTrainer(Trainer):
    def compute_loss(self, batch):
        loss, num_tokens = answer_token_loss(self.model, batch["input_ids"], batch["attention_mask"], batch["labels"])
        return loss, {}, float(num_tokens)
