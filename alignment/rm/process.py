"""Process reward model training (`process_reward: true`, PaddleNLP's key): a causal LM learns, at the
placeholder after each step of a solution, to prefer the first reward token for a correct step and the second for
a wrong one (alignment/rewards/process.py). The loss is the mean cross-entropy over the two reward tokens' logits
of every step of the optimizer step; `step_accuracy` is how often the larger logit is the label's."""
from __future__ import annotations

from typing import Dict, List

import numpy as np
import paddle
import paddle.nn.functional as F

from alignment.data.raw import samples_with
from alignment.data.tokenized import pad_sequences
from alignment.rewards.process import StepTokens, step_ids, step_logits
from alignment.training.dataset_trainer import DatasetTrainer


class StepDataset:
    """Items: input_ids, positions (the placeholders' last tokens), labels (1 = correct step)."""

    def __init__(self, raw, tokenizer, tokens: StepTokens, max_length: int):
        self.items, self.stats = [], {"dropped_no_step_fits": 0, "steps": 0}
        for sample in samples_with(raw, lambda s: ("steps", "step_labels"), "a PRM needs step-labelled rows "
                                                                              "(dataset 'process-reward')"):
            ids, positions = step_ids(tokenizer, sample.get("input", ""), sample["steps"], tokens, max_length)
            if not positions:
                self.stats["dropped_no_step_fits"] += 1
                continue
            labels = [int(v) for v in sample["step_labels"][: len(positions)]]
            self.stats["steps"] += len(labels)
            self.items.append({"input_ids": ids, "positions": positions, "labels": labels})

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, index: int) -> dict:
        return self.items[index]


def collate_steps(items: List[dict], pad_id: int) -> Dict[str, np.ndarray]:
    """Right-padded ids [b, s], mask [b, s], positions [k, 2] (row, column) and labels [k] of every step."""
    ids = [item["input_ids"] for item in items]
    return {"input_ids": pad_sequences(ids, pad_id),
            "attention_mask": pad_sequences([[1] * len(i) for i in ids], 0),
            "positions": np.asarray([[row, p] for row, item in enumerate(items) for p in item["positions"]],
                                    dtype="int64"),
            "step_labels": np.asarray([v for item in items for v in item["labels"]], dtype="int64")}


class ProcessRewardTrainer(DatasetTrainer):
    evaluate_at_start = True  # held-out step accuracy before -> after

    def __init__(self, tokens: StepTokens, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.tokens = tokens

    def compute_loss(self, batch):
        logits = step_logits(self.model, batch["input_ids"], batch["attention_mask"], batch["positions"],
                             self.tokens)  # [k, 2]: good, bad
        target = 1 - batch["step_labels"]  # [k]: 0 = good (column 0), 1 = bad
        loss = F.cross_entropy(logits.astype("float32"), target.unsqueeze(-1)).mean()
        correct = (paddle.argmax(logits, axis=-1) == target).astype("float32")  # [k]
        return loss, {"step_accuracy": float(correct.mean())}, float(target.shape[0])

    def batch_weight(self, batch) -> float:
        return float(batch["step_labels"].shape[0])
