"""Supervised fine-tuning: next-token cross-entropy on answer tokens only."""
from __future__ import annotations

from alignment.data.tokenized import IGNORE_INDEX
from alignment.models.logprobs import answer_token_loss, answer_token_loss_from_logits
from alignment.models.moe import moe_training_terms
from alignment.training.dataset_trainer import DatasetTrainer


class SupervisedTrainer(DatasetTrainer):
    def compute_loss(self, batch):
        loss, num_tokens = answer_token_loss(self.model, batch["input_ids"], batch["attention_mask"], batch["labels"])
        aux, metrics = moe_training_terms(self.model, batch["attention_mask"],  # experts: the load-balancing loss
                                          self.batch_weight(batch))
        return (loss if aux is None else loss + aux), metrics, float(num_tokens)

    def batch_weight(self, batch) -> float:
        return float((batch["labels"][:, 1:] != IGNORE_INDEX).astype("float32").sum())

    # pipeline parallelism: the last stage has the whole-sequence logits
    def pipeline_labels(self, batch):
        return (batch["labels"],)

    def pipeline_loss(self, logits, labels):
        loss, num_tokens = answer_token_loss_from_logits(logits, labels[0])
        return loss, {}, float(num_tokens)
