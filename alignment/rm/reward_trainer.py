"""Reward-model training: pairwise loss on (better, worse) pairs, pairwise accuracy and score statistics."""
from __future__ import annotations

from typing import Dict

import numpy as np
import paddle
from tqdm import tqdm

from alignment.config.reward import RewardArguments
from alignment.models.score_model import last_token_index
from alignment.rm.losses import sequence_wise_loss, token_wise_loss
from alignment.parallel.distributed import gather_lists
from alignment.training.dataset_trainer import DatasetTrainer


def split_pairs(batch: Dict[str, paddle.Tensor]):
    """The preference collator stacks better rows, then worse rows: [2b, s] -> two [b, s] halves."""
    half = batch["input_ids"].shape[0] // 2
    ids, mask = batch["input_ids"], batch["attention_mask"]
    return ids[:half], ids[half:], mask[:half], mask[half:]


class RewardTrainer(DatasetTrainer):
    evaluate_at_start = True  # held-out accuracy before -> after

    def __init__(self, reward_args: RewardArguments, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.reward_args = reward_args

    def loss_and_end_scores(self, batch):
        """-> (loss, better end scores [b], worse end scores [b]) from one forward over the stacked pairs."""
        out = self.model(batch["input_ids"], batch["attention_mask"])
        return self.pair_loss(out.scores, out.end_scores, batch)

    def pair_loss(self, scores, end_scores, batch):
        """scores [2b, s], end_scores [2b] of the stacked pairs -> (loss, better end [b], worse end [b])."""
        half = end_scores.shape[0] // 2
        better_end, worse_end = end_scores[:half], end_scores[half:]  # [b] each
        reg = self.reward_args.regularization
        if self.reward_args.loss_type == "sequence-wise":
            return sequence_wise_loss(better_end, worse_end, reg), better_end, worse_end
        better_ids, worse_ids, better_mask, worse_mask = split_pairs(batch)
        loss = token_wise_loss(scores[:half], scores[half:], better_end, worse_end, better_ids, worse_ids,
                               better_mask, worse_mask, reg)
        return loss, better_end, worse_end

    def compute_loss(self, batch):
        return self.with_accuracy(*self.loss_and_end_scores(batch))

    @staticmethod
    def with_accuracy(loss, better_end, worse_end):
        accuracy = float((better_end > worse_end).astype("float32").mean())
        return loss, {"accuracy": accuracy}, float(better_end.shape[0])

    def batch_weight(self, batch) -> float:
        return float(batch["input_ids"].shape[0] // 2)

    # pipeline parallelism: the last stage has the raw per-token scores [2b, s]
    def pipeline_labels(self, batch):
        return batch["input_ids"], batch["attention_mask"]

    def pipeline_loss_and_end_scores(self, scores, labels):
        """What ScoreModel.forward adds to the scores (end scores, normaliser), then pair_loss."""
        input_ids, attention_mask = labels
        end_scores = paddle.take_along_axis(scores, last_token_index(attention_mask).unsqueeze(-1), axis=1)
        end_scores = end_scores.squeeze(-1)  # [2b]
        normalizer, config = self.model.normalizer, self.model.config
        if self.model.training:
            normalizer.update(end_scores.detach())
        if config.do_normalize:
            scores, end_scores = normalizer.normalize(scores), normalizer.normalize(end_scores)
        return self.pair_loss(scores, end_scores, {"input_ids": input_ids, "attention_mask": attention_mask})

    def pipeline_loss(self, scores, labels):
        return self.with_accuracy(*self.pipeline_loss_and_end_scores(scores, labels))

    @paddle.no_grad()
    def evaluate(self) -> Dict[str, float]:
        if self.eval_dataset is None or not self.args.do_eval or len(self.eval_dataset) == 0:
            return {}
        def record(loss, better_end, worse_end):
            return float(loss) * better_end.shape[0], better_end.numpy().tolist(), worse_end.numpy().tolist()

        better, worse, losses = [], [], []
        for loss, better_ends, worse_ends in self.eval_records(
                lambda batch: record(*self.loss_and_end_scores(batch)),
                lambda scores, labels: record(*self.pipeline_loss_and_end_scores(scores, labels))):
            better += better_ends
            worse += worse_ends
            losses.append(loss)
        better, worse = np.array(gather_lists(better)), np.array(gather_lists(worse))
        results = {"eval/loss": sum(gather_lists(losses)) / len(better),
                   "eval/accuracy": float((better > worse).mean()),
                   "eval/chosen_score": float(better.mean()), "eval/rejected_score": float(worse.mean()),
                   "eval/chosen_score_std": float(better.std()), "eval/rejected_score_std": float(worse.std())}
        edges = np.histogram_bin_edges(np.concatenate([better, worse]), bins=20)
        histogram = {"bin_edges": edges.tolist(), "chosen": np.histogram(better, edges)[0].tolist(),
                     "rejected": np.histogram(worse, edges)[0].tolist()}
        self.logger.log(self.global_step, {**results, "eval/score_histogram": histogram}, echo=None)
        self.logger.log_histogram("eval/chosen_scores", better, self.global_step)
        self.logger.log_histogram("eval/rejected_scores", worse, self.global_step)
        if self.logger.enabled:
            tqdm.write(f"step {self.global_step}: " + ", ".join(f"{k}={v:.4g}" for k, v in results.items()))
        return results
