"""The training loop shared by the supervised stages (SFT, reward model): a subclass only defines its loss.

    compute_loss(batch) -> (loss, metrics, weight)   # weight: what eval averages by (tokens, pairs, ...)

Data order is a seeded permutation per epoch, so a run is reproducible from `seed`.
"""
from __future__ import annotations

import math
import os
import random
import time
from typing import Callable, Dict, Iterator, List, Optional

import numpy as np
import paddle
from tqdm import tqdm

from alignment.training.arguments import TrainingArguments
from alignment.training.checkpointing import load_checkpoint, resolve_resume, save_checkpoint, skip_batches
from alignment.training.distributed import (average_gradients, barrier, data_world_size, init_distributed,
                                            is_main_process, layout_name, mean_over_ranks, shard)
from alignment.training.logger import MetricsLogger
from alignment.training.optim import build_optimizer, clip_gradients, global_grad_norm


class TrainingStopped(RuntimeError):
    """The run cannot go on (e.g. too many non-finite steps in a row); the message says why and what is intact."""


class NonFiniteGuard:
    """Counts steps whose loss or gradients are NaN/inf (the caller skips them) and stops the run after
    `limit` in a row."""

    def __init__(self, limit: int, output_dir: str):
        self.limit, self.output_dir = limit, output_dir
        self.skipped = self.in_a_row = 0

    def check(self, step: int, *values: float) -> bool:
        """True when every value is finite; otherwise count the step and raise after `limit` in a row."""
        if all(math.isfinite(v) for v in values):
            self.in_a_row = 0
            return True
        self.skipped += 1
        self.in_a_row += 1
        if self.in_a_row >= self.limit:
            raise TrainingStopped(
                f"step {step}: loss or gradients were NaN/inf in {self.in_a_row} steps in a row (key "
                f"'max_nonfinite_steps' = {self.limit}); stopping without saving. Checkpoints already written "
                f"under {self.output_dir} are intact: lower learning_rate and resume with resume_from_checkpoint.")
        return False

    def state_dict(self) -> dict:
        return {"skipped": self.skipped, "in_a_row": self.in_a_row}

    def load_state_dict(self, state: dict) -> None:
        self.skipped, self.in_a_row = state["skipped"], state["in_a_row"]


def set_seed(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    paddle.seed(seed)


def epoch_batches(num_items: int, batch_size: int, seed: int, shuffle: bool = True,
                  min_size: int = 1) -> Iterator[np.ndarray]:
    """Index batches forever, a fresh seeded permutation each epoch. The last batch of an epoch may be short;
    one shorter than `min_size` (the world size: every rank needs an item) is skipped."""
    if num_items < min_size:
        raise ValueError(f"{num_items} samples cannot be shared by {min_size} data-parallel processes")
    epoch = 0
    while True:
        order = np.random.default_rng(seed + epoch).permutation(num_items) if shuffle else np.arange(num_items)
        for start in range(0, num_items, batch_size):
            if len(order[start: start + batch_size]) >= min_size:
                yield order[start: start + batch_size]
        epoch += 1


def to_tensors(batch: Dict[str, np.ndarray]) -> Dict[str, paddle.Tensor]:
    return {k: paddle.to_tensor(v) for k, v in batch.items()}


class Trainer:
    def __init__(self, args: TrainingArguments, model, tokenizer, train_dataset, eval_dataset,
                 collate_fn: Callable, effective_args: Optional[dict] = None):
        self.args, self.model, self.tokenizer = args, model, tokenizer
        self.train_dataset, self.eval_dataset, self.collate_fn = train_dataset, eval_dataset, collate_fn
        if len(train_dataset) == 0:
            raise ValueError("the training dataset is empty after tokenization (see the counts printed above)")
        init_distributed()
        self.logger = MetricsLogger(args.output_dir, enabled=is_main_process(),
                                    first_files={"args.json": effective_args} if effective_args else None)
        samples_per_step = args.per_device_train_batch_size * args.gradient_accumulation_steps * data_world_size()
        steps_per_epoch = math.ceil(len(train_dataset) / samples_per_step)
        self.total_steps = args.max_steps if args.max_steps > 0 else max(1, int(steps_per_epoch * args.num_train_epochs))
        self.optimizer, self.scheduler = build_optimizer(model, args, self.total_steps)
        self.global_step = 0
        self.batches_drawn = 0
        self.guard = NonFiniteGuard(args.max_nonfinite_steps, args.output_dir)
        self.resume_path = resolve_resume(args.output_dir, args.resume_from_checkpoint)
        if self.resume_path is not None:
            self.resume(self.resume_path)

    # --- what a stage overrides -------------------------------------------------------------------------------
    def compute_loss(self, batch: Dict[str, paddle.Tensor]):
        """Return (scalar loss tensor, {metric: float}, weight: float)."""
        raise NotImplementedError

    def batch_tokens(self, batch: Dict[str, paddle.Tensor]) -> int:
        return int(batch["attention_mask"].sum())

    # --- the loop ---------------------------------------------------------------------------------------------
    def train(self) -> Dict[str, float]:
        args = self.args
        world = data_world_size()
        batches = epoch_batches(len(self.train_dataset), args.per_device_train_batch_size * world, args.seed,
                                min_size=world)
        skip_batches(batches, self.batches_drawn)  # a resumed run goes on where the checkpoint stopped
        self.model.train()
        window, window_tokens, window_start = [], 0, time.perf_counter()
        progress = tqdm(total=self.total_steps, initial=self.global_step, desc="train", dynamic_ncols=True,
                        disable=args.disable_tqdm or not is_main_process())
        last_eval = {}
        while self.global_step < self.total_steps:
            step_metrics = []
            for _ in range(args.gradient_accumulation_steps):
                batch = to_tensors(self.collate_fn([self.train_dataset[int(i)] for i in shard(next(batches))]))
                self.batches_drawn += 1
                loss, metrics, _ = self.compute_loss(batch)
                (loss / args.gradient_accumulation_steps).backward()
                step_metrics.append({"loss": float(loss), **metrics})
                window_tokens += self.batch_tokens(batch)
            average_gradients(self.model.parameters())
            grad_norm = global_grad_norm(self.model.parameters())
            lr = self.optimizer.get_lr()
            if self.guard.check(self.global_step + 1, grad_norm, *(row["loss"] for row in step_metrics)):
                clip_gradients(self.model.parameters(), args.max_grad_norm, grad_norm)
                self.optimizer.step()
                self.scheduler.step()
            self.optimizer.clear_grad()  # a skipped step's gradients are dropped too
            self.global_step += 1
            progress.update(1)
            window.append({**_mean(step_metrics), "grad_norm": grad_norm, "lr": lr,
                           "skipped_steps": float(self.guard.skipped)})
            if self.global_step % args.logging_steps == 0 or self.global_step == self.total_steps:
                elapsed = time.perf_counter() - window_start
                logged = mean_over_ranks({**_mean(window), "tokens_per_sec": window_tokens / max(elapsed, 1e-9)})
                logged["tokens_per_sec"] *= data_world_size()  # throughput of all processes together
                self.logger.log(self.global_step, logged, echo=progress.write)
                progress.set_postfix(loss=f"{logged['loss']:.4f}")
                window, window_tokens, window_start = [], 0, time.perf_counter()
            if self._due(args.eval_steps) and self.global_step < self.total_steps:
                last_eval = self.evaluate()
            if self._due(args.save_steps) and self.global_step < self.total_steps:
                self.save_step_checkpoint()
        progress.close()
        if self.eval_dataset is not None and args.do_eval:
            last_eval = self.evaluate()
        self.save_model(os.path.join(args.output_dir, "model"))
        self.logger.close()
        return last_eval

    def _due(self, every: int) -> bool:
        return every > 0 and self.global_step % every == 0

    @paddle.no_grad()
    def evaluate(self) -> Dict[str, float]:
        if self.eval_dataset is None or not self.args.do_eval or len(self.eval_dataset) == 0:
            return {}
        self.model.eval()
        totals, total_weight = {}, 0.0
        size = self.args.per_device_eval_batch_size
        for indices in eval_shards(len(self.eval_dataset), size):
            loss, metrics, weight = self.compute_loss(to_tensors(self.collate_fn([self.eval_dataset[i] for i in indices])))
            for key, value in {"loss": float(loss), **metrics}.items():
                totals[key] = totals.get(key, 0.0) + value * weight
            total_weight += weight
        self.model.train()
        sums = mean_over_ranks({**totals, "_weight": total_weight})  # ratios of means = ratios of sums
        results = {f"eval/{k}": v / max(sums["_weight"], 1e-12) for k, v in sums.items() if k != "_weight"}
        self.logger.log(self.global_step, results, echo=tqdm.write)
        return results

    def save_model(self, path: str) -> None:
        self.model.save_pretrained(path, tokenizer_dir=self.tokenizer.name_or_path)  # rank 0 writes
        barrier()

    # --- resumable checkpoints (alignment/training/checkpointing.py) ----------------------------------------------
    def trainer_state(self) -> dict:
        """Counters a resumed run needs besides models, optimizers and RNGs; a stage may add its own."""
        return {"batches_drawn": self.batches_drawn, "nonfinite": self.guard.state_dict()}

    def load_trainer_state(self, state: dict) -> None:
        self.global_step, self.batches_drawn = state["global_step"], state["batches_drawn"]
        self.guard.load_state_dict(state["nonfinite"])

    def save_step_checkpoint(self) -> None:
        save_checkpoint(self.args.output_dir, self.global_step, {"model": self.model},
                        {"model": (self.optimizer, self.scheduler)}, self.trainer_state(),
                        self.tokenizer.name_or_path, self.args.save_total_limit, layout_name())  # every rank
        barrier()

    def resume(self, path: str) -> None:
        self.load_trainer_state(load_checkpoint(path, {"model": self.model},
                                                {"model": (self.optimizer, self.scheduler)}, layout_name()))
        self.logger.resume_at(self.global_step)
        print(f"resumed from {path} at step {self.global_step}")


def eval_shards(num_items: int, batch_size: int) -> Iterator[List[int]]:
    """This rank's evaluation batches: a strided share of the items, in batches of `batch_size`."""
    mine = list(shard(range(num_items)))
    for start in range(0, len(mine), batch_size):
        yield mine[start: start + batch_size]


def _mean(rows):
    keys = rows[0].keys()
    return {k: float(np.mean([r[k] for r in rows])) for k in keys}
