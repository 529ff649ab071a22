"""Reward-model training: pairwise loss on (better, worse) pairs, pairwise accuracy and score statistics."""
from __future__ import annotations

from typing import Dict

import numpy as np
import paddle
from tqdm import tqdm

from alignment.config.reward import RewardArguments
from alignment.rm.losses import sequence_wise_loss, token_wise_loss
from alignment.parallel.distributed import gather_lists
from alignment.training.batches import eval_shards, to_tensors
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
        half = out.end_scores.shape[0] // 2
        better_end, worse_end = out.end_scores[:half], out.end_scores[half:]  # [b] each
        reg = self.reward_args.regularization
        if self.reward_args.loss_type == "sequence-wise":
            return sequence_wise_loss(better_end, worse_end, reg), better_end, worse_end
        better_ids, worse_ids, better_mask, worse_mask = split_pairs(batch)
        loss = token_wise_loss(out.scores[:half], out.scores[half:], better_end, worse_end, better_ids, worse_ids,
                               better_mask, worse_mask, reg)
        return loss, better_end, worse_end

    def compute_loss(self, batch):
        loss, better_end, worse_end = self.loss_and_end_scores(batch)
        accuracy = float((better_end > worse_end).astype("float32").mean())
        return loss, {"accuracy": accuracy}, float(better_end.shape[0])

    @paddle.no_grad()
    def evaluate(self) -> Dict[str, float]:
        if self.eval_dataset is None or not self.args.do_eval or len(self.eval_dataset) == 0:
            return {}
        self.model.eval()
        better, worse, losses = [], [], []
        for indices in eval_shards(len(self.eval_dataset), self.args.per_device_eval_batch_size):
            items = [self.eval_dataset[i] for i in indices]
            loss, better_end, worse_end = self.loss_and_end_scores(to_tensors(self.collate_fn(items)))
            better += better_end.numpy().tolist()
            worse += worse_end.numpy().tolist()
            losses.append(float(loss) * len(items))
        self.model.train()
        better, worse = np.array(gather_lists(better)), np.array(gather_lists(worse))
        results = {"eval/loss": sum(gather_lists(losses)) / len(better), "eval/accuracy": float((better > worse).mean()),
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
