"""Supervised fine-tuning: next-token cross-entropy on answer tokens only."""
from __future__ import annotations

from alignment.models.logprobs import answer_token_loss
from alignment.training.dataset_trainer import DatasetTrainer


class SupervisedTrainer(DatasetTrainer):
    def compute_loss(self, batch):
        loss, num_tokens = answer_token_loss(self.model, batch["input_ids"], batch["attention_mask"], batch["labels"])
        return loss, {}, float(num_tokens)
