"""The stages that train one model on a fixed dataset (SFT, reward model, DPO): a subclass only defines its loss.

    compute_loss(batch) -> (loss, metrics, weight)   # weight: what the loss averages over (tokens, pairs, ...)
    batch_weight(batch) -> float                     # compute_loss's weight, known before the forward

The step's loss is one mean over every micro-batch of its gradient accumulation on every data rank (each
micro-batch's mean is weighted by its share of the weight, step_shares), never a mean of per-micro-batch means: N
processes and any accumulation count train exactly as one process with the global batch in one micro-batch
(tests/training/test_split_invariance_offline.py).

Pipeline-parallel models (alignment/wrappers/pipeline.py) run the same micro-batches through fleet's 1F1B schedule;
a stage then also defines what its last pipeline stage computes:

    pipeline_labels(batch) -> tuple of tensors            # what the last stage needs besides the model's outputs
    pipeline_loss(outputs, labels) -> (loss, metrics, weight)   # compute_loss from the last stage's outputs
"""
from __future__ import annotations

import math
import os
import time
from typing import Callable, Dict, List, Optional

import paddle
from tqdm import tqdm

from alignment.parallel.distributed import (barrier, data_world_size, expert_parallel_degree, gather_objects,
                                            mean_over_ranks, shard, step_shares, sum_over_data_ranks)
from alignment.training.batches import batches_per_epoch, epoch_batches, eval_shards, skip_batches, to_tensors
from alignment.training.logger import hide_progress
from alignment.training.trainer import Trainer, mean_rows
from alignment.wrappers.pipeline import PipelineModel, micro_batch_lists, pipeline_forward, pipeline_step


class DatasetTrainer(Trainer):
    def __init__(self, args, model, tokenizer, train_dataset, eval_dataset, collate_fn: Callable,
                 effective_args: Optional[dict] = None):
        if len(train_dataset) == 0:
            raise ValueError("the training dataset is empty after tokenization (see the counts printed above)")
        super().__init__(args, tokenizer, effective_args)
        self.model, self.collate_fn = model, collate_fn
        self.train_dataset, self.eval_dataset = train_dataset, eval_dataset
        batches = batches_per_epoch(len(train_dataset), args.per_device_train_batch_size * data_world_size(),
                                    args.dataloader_drop_last)
        steps_per_epoch = math.ceil(batches / args.gradient_accumulation_steps)
        self.total_steps = args.max_steps if args.max_steps > 0 else \
            max(1, int(steps_per_epoch * args.num_train_epochs))
        self.optimizer = self.add_trained("model", model, self.total_steps).optimizer
        self.pipe = None  # fleet's 1F1B runner of a pipeline model
        if isinstance(model, PipelineModel):
            from paddle.distributed import fleet

            self.pipe = fleet.distributed_model(model)
        self.batches_drawn = 0
        self.resume_if_asked()

    # --- what a stage overrides -------------------------------------------------------------------------------
    def compute_loss(self, batch: Dict[str, paddle.Tensor]):
        """Return (scalar loss tensor, {metric: float}, weight: float)."""
        raise NotImplementedError

    def batch_tokens(self, batch: Dict[str, paddle.Tensor]) -> int:
        return int(batch["attention_mask"].sum())

    def batch_weight(self, batch: Dict[str, paddle.Tensor]) -> float:
        """compute_loss's weight, from the batch alone."""
        raise NotImplementedError

    def pipeline_labels(self, batch: Dict[str, paddle.Tensor]) -> tuple:
        raise ValueError(f"key 'pipeline_parallel_degree': {type(self).__name__} has no pipeline-parallel variant")

    def pipeline_loss(self, outputs, labels: tuple):
        raise NotImplementedError

    # --- the skeleton's hooks -----------------------------------------------------------------------------------
    def start_data_streams(self) -> None:
        world = data_world_size()
        self.batches = epoch_batches(len(self.train_dataset), self.args.per_device_train_batch_size * world,
                                     self.args.seed, min_size=world, drop_last=self.args.dataloader_drop_last)
        skip_batches(self.batches, self.batches_drawn)  # a resumed run goes on where the checkpoint stopped
        self.model.train()
        self._window_tokens, self._window_start = 0, time.perf_counter()
        self._step_counts = [0, 0, 0]  # samples, tokens and padded tokens of the step (benchmark)

    def next_batch(self) -> Dict[str, paddle.Tensor]:
        batch = to_tensors(self.collate_fn([self.train_dataset[int(i)] for i in shard(next(self.batches))]))
        self.batches_drawn += 1
        tokens = self.batch_tokens(batch)
        self._window_tokens += tokens
        rows, width = batch["input_ids"].shape
        self._step_counts = [a + b for a, b in zip(self._step_counts, (rows, tokens, rows * width))]
        return batch

    def benchmark_counts(self) -> Dict[str, float]:
        counts = sum_over_data_ranks(paddle.to_tensor(self._step_counts, dtype="float64")).numpy().tolist()
        self._step_counts = [0, 0, 0]
        return dict(zip(("samples", "tokens", "padded_tokens"), counts))

    def training_step(self) -> Dict[str, float]:
        """gradient_accumulation_steps micro-batches, then one guarded optimizer step."""
        if self.pipe is not None:
            return self.pipeline_training_step()
        batches, rows = [self.next_batch() for _ in range(self.args.gradient_accumulation_steps)], []
        # the loss is one mean over every micro-batch and process of the step, not a mean of their means
        shares = step_shares([self.batch_weight(batch) for batch in batches])
        for batch, share in zip(batches, shares):
            with self.precision.autocast():
                loss, metrics, _ = self.compute_loss(batch)
            self.precision.backward(loss * share)
            rows.append({"loss": float(loss) * share, **metrics})
        return self.finish_step({**mean_rows(rows), "loss": sum(row["loss"] for row in rows)},
                                [row["loss"] for row in rows])

    def finish_step(self, row: Dict[str, float], losses: List[float]) -> Dict[str, float]:
        lr = self.optimizer.get_lr()
        grad_norm, = self.optimizer_step(*losses)
        row = {**row, "grad_norm": grad_norm, "lr": lr, "skipped_steps": float(self.guard.skipped)}
        if self.precision.scaler is not None:
            row["loss_scale"] = self.precision.loss_scale
        return row

    def pipeline_training_step(self) -> Dict[str, float]:
        """The same micro-batches and loss scaling as training_step, in one 1F1B run over the pipeline stages."""
        accum, micro_batches = self.args.gradient_accumulation_steps, []
        batches = [self.next_batch() for _ in range(accum)]
        for batch, share in zip(batches, step_shares([self.batch_weight(batch) for batch in batches])):
            share *= accum  # fleet divides by accum
            micro_batches.append(((batch["input_ids"], batch["attention_mask"]),
                                  (*self.pipeline_labels(batch), paddle.to_tensor([[share]], dtype="float32"))))
        loss_fn = self.model._loss_fn[0]

        def scaled_loss(outputs, labels):  # fleet divides by accum, as training_step does
            *labels, share = labels
            loss, metrics, _ = self.pipeline_loss(outputs, tuple(labels))
            share = float(share[0, 0])
            for key, value in {"loss": float(loss) * share, **metrics}.items():
                loss_fn.stats[key] = loss_fn.stats.get(key, 0.0) + value
            return loss * share

        loss_fn.fn = scaled_loss
        inputs, labels = zip(*micro_batches)
        with self.precision.autocast():
            row = pipeline_step(self.pipe, micro_batch_lists(inputs), micro_batch_lists(labels), loss_fn, accum,
                                scaler=self.precision.scaler)
        return self.finish_step(row, [row["loss"]])

    def log_row(self, window) -> Dict[str, float]:
        elapsed = time.perf_counter() - self._window_start
        logged = mean_over_ranks({**mean_rows(window), "tokens_per_sec": self._window_tokens / max(elapsed, 1e-9)})
        logged["tokens_per_sec"] *= data_world_size()  # throughput of all processes together
        self._window_tokens, self._window_start = 0, time.perf_counter()
        return logged

    def has_eval_data(self) -> bool:
        return self.eval_dataset is not None

    def eval_records(self, eager: Callable, pipelined: Callable) -> list:
        """One picklable record per evaluation batch of this rank: eager(batch), or for a pipeline model
        pipelined(outputs, pipeline_labels(batch)) on the last stage (every stage gets the records)."""
        self.model.eval()
        with self.precision.autocast():
            records = self._eval_records(eager, pipelined)
        self.model.train()
        return records

    def _eval_records(self, eager: Callable, pipelined: Callable) -> list:
        records, pending = [], []
        shards = list(eval_shards(len(self.eval_dataset), self.args.per_device_eval_batch_size))
        owed = 0
        if expert_parallel_degree() > 1:  # every forward exchanges tokens: the ranks run as many, extras discarded
            owed = max(gather_objects(len(shards))) - len(shards)
        for _ in range(owed):
            eager(to_tensors(self.collate_fn([self.eval_dataset[i] for i in (shards[-1] if shards else [0])])))
        for number, indices in enumerate(tqdm(shards, desc="evaluate", leave=False, dynamic_ncols=True,
                                              disable=hide_progress(self.args))):
            batch = to_tensors(self.collate_fn([self.eval_dataset[i] for i in indices]))
            if self.pipe is None:
                records.append(eager(batch))
                continue
            pending.append(((batch["input_ids"], batch["attention_mask"]), self.pipeline_labels(batch)))
            if len(pending) == self.pipe.accumulate_steps or number == len(shards) - 1:
                records += pipeline_forward(self.pipe, pending, pipelined)
                pending = []
        return records

    @paddle.no_grad()
    def evaluate(self) -> Dict[str, float]:
        if self.eval_dataset is None or not self.args.do_eval or len(self.eval_dataset) == 0:
            return {}

        def weighted(loss, metrics, weight):
            return {"loss": float(loss) * weight, **{k: v * weight for k, v in metrics.items()}, "_weight": weight}

        totals = {}
        for record in self.eval_records(lambda batch: weighted(*self.compute_loss(batch)),
                                        lambda outputs, labels: weighted(*self.pipeline_loss(outputs, labels))):
            for key, value in record.items():
                totals[key] = totals.get(key, 0.0) + value
        sums = mean_over_ranks(totals)  # ratios of means = ratios of sums
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
