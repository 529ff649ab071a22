"""The stages that train one model on a fixed dataset (SFT, reward model, DPO): a subclass only defines its loss.

    compute_loss(batch) -> (loss, metrics, weight)   # weight: what the loss averages over (tokens, pairs, ...)

Under data parallelism the loss is the mean over the whole global batch (each rank's mean is weighted by its
share of the weight), so N processes train exactly as one process with the global batch.
"""
from __future__ import annotations

import math
import os
import time
from typing import Callable, Dict, Optional

import paddle
from tqdm import tqdm

from alignment.parallel.distributed import barrier, data_world_size, mean_over_ranks, shard, share_of_data_ranks
from alignment.training.batches import epoch_batches, eval_shards, skip_batches, to_tensors
from alignment.training.trainer import Trainer, mean_rows


class DatasetTrainer(Trainer):
    def __init__(self, args, model, tokenizer, train_dataset, eval_dataset, collate_fn: Callable,
                 effective_args: Optional[dict] = None):
        if len(train_dataset) == 0:
            raise ValueError("the training dataset is empty after tokenization (see the counts printed above)")
        super().__init__(args, tokenizer, effective_args)
        self.model, self.collate_fn = model, collate_fn
        self.train_dataset, self.eval_dataset = train_dataset, eval_dataset
        samples_per_step = args.per_device_train_batch_size * args.gradient_accumulation_steps * data_world_size()
        steps_per_epoch = math.ceil(len(train_dataset) / samples_per_step)
        self.total_steps = args.max_steps if args.max_steps > 0 else \
            max(1, int(steps_per_epoch * args.num_train_epochs))
        self.optimizer = self.add_trained("model", model, self.total_steps).optimizer
        self.batches_drawn = 0
        self.resume_if_asked()

    # --- what a stage overrides -------------------------------------------------------------------------------
    def compute_loss(self, batch: Dict[str, paddle.Tensor]):
        """Return (scalar loss tensor, {metric: float}, weight: float)."""
        raise NotImplementedError

    def batch_tokens(self, batch: Dict[str, paddle.Tensor]) -> int:
        return int(batch["attention_mask"].sum())

    # --- the skeleton's hooks -----------------------------------------------------------------------------------
    def start_data_streams(self) -> None:
        world = data_world_size()
        self.batches = epoch_batches(len(self.train_dataset), self.args.per_device_train_batch_size * world,
                                     self.args.seed, min_size=world)
        skip_batches(self.batches, self.batches_drawn)  # a resumed run goes on where the checkpoint stopped
        self.model.train()
        self._window_tokens, self._window_start = 0, time.perf_counter()

    def training_step(self) -> Dict[str, float]:
        """gradient_accumulation_steps micro-batches, then one guarded optimizer step."""
        accum, rows = self.args.gradient_accumulation_steps, []
        for _ in range(accum):
            batch = to_tensors(self.collate_fn([self.train_dataset[int(i)] for i in shard(next(self.batches))]))
            self.batches_drawn += 1
            loss, metrics, weight = self.compute_loss(batch)
            share = share_of_data_ranks(weight)  # the loss is a mean over the whole batch, not per process
            (loss * share / accum).backward()
            rows.append({"loss": float(loss) * share, **metrics})
            self._window_tokens += self.batch_tokens(batch)
        lr = self.optimizer.get_lr()
        grad_norm, = self.optimizer_step(*(row["loss"] for row in rows))
        return {**mean_rows(rows), "grad_norm": grad_norm, "lr": lr, "skipped_steps": float(self.guard.skipped)}

    def log_row(self, window) -> Dict[str, float]:
        elapsed = time.perf_counter() - self._window_start
        logged = mean_over_ranks({**mean_rows(window), "tokens_per_sec": self._window_tokens / max(elapsed, 1e-9)})
        logged["tokens_per_sec"] *= data_world_size()  # throughput of all processes together
        self._window_tokens, self._window_start = 0, time.perf_counter()
        return logged

    def has_eval_data(self) -> bool:
        return self.eval_dataset is not None

    @paddle.no_grad()
    def evaluate(self) -> Dict[str, float]:
        if self.eval_dataset is None or not self.args.do_eval or len(self.eval_dataset) == 0:
            return {}
        self.model.eval()
        totals, total_weight = {}, 0.0
        size = self.args.per_device_eval_batch_size
        for indices in eval_shards(len(self.eval_dataset), size):
            batch = to_tensors(self.collate_fn([self.eval_dataset[i] for i in indices]))
            loss, metrics, weight = self.compute_loss(batch)
            for key, value in {"loss": float(loss), **metrics}.items():
                totals[key] = totals.get(key, 0.0) + value * weight
            total_weight += weight
        self.model.train()
        sums = mean_over_ranks({**totals, "_weight": total_weight})  # ratios of means = ratios of sums
        results = {f"eval/{k}": v / max(sums["_weight"], 1e-12) for k, v in sums.items() if k != "_weight"}
        self.logger.log(self.global_step, results, echo=tqdm.write)
        return results

    def save(self, output_dir: str) -> None:
        self.save_model(os.path.join(output_dir, "model"))

    def save_model(self, path: str) -> None:
        self.model.save_pretrained(path, tokenizer_dir=self.tokenizer.name_or_path)  # rank 0 writes
        barrier()

    def trainer_state(self) -> dict:
        return {**super().trainer_state(), "batches_drawn": self.batches_drawn}

    def load_trainer_state(self, state: dict) -> None:
        super().load_trainer_state(state)
        self.batches_drawn = state["batches_drawn"]
