"""The skeleton every stage runs on. The step loop, the guarded optimizer step, logging, the evaluation and
checkpoint cadence, resuming and progress live here once; a stage fills in the hooks:

    training_step() -> metrics        one optimizer step's work (SFT / RM / DPO: a batch; RL: a rollout)
    evaluate() -> metrics             held-out evaluation, every eval_steps and at the end ({} when there is none)
    has_eval_data() -> bool           whether the end-of-run evaluation happens
    save(output_dir)                  the final models
    start_data_streams()              (re)open the data iterators, skipping what a resumed run already drew
    trainer_state() / load_trainer_state(state)   counters a resumed run needs besides models and optimizers
    after_step(metrics)               look at one step's metrics (RL: the run monitors) before they are logged
    log_row(window) -> metrics        one logged row from the steps since the last one (default: their mean)

What is trained is registered with `add_trained(name, model, ...)`: each gets an AdamW optimizer and schedule, split
over the sharding ranks as `sharding` asks (training/sharding.py), is stepped together by `optimizer_step()` and
saved under `name` in step checkpoints. A stage's constructor ends with `resume_if_asked()`, once everything a
checkpoint restores exists (so a bad checkpoint fails before training). `benchmark: true` trains without
evaluating or saving and reports the run's speed and memory (training/benchmark.py).
"""
from __future__ import annotations

import contextlib
import dataclasses
import math
import time
from typing import Dict, List, Optional

import numpy as np
from tqdm import tqdm

from alignment.cpu_env import optimizer_threads
from alignment.parallel.distributed import (barrier, gather_objects, init_distributed, is_main_process, layout_name,
                                            training_world)
from alignment.training.benchmark import Throughput, peak_rss_gib, tensors_gib, timelog_lines
from alignment.training.best_model import BestModel
from alignment.training.checkpointing import load_checkpoint, resolve_resume, save_checkpoint
from alignment.training.guard import NonFiniteGuard, TrainingStopped
from alignment.training.logger import MetricsLogger, hide_progress
from alignment.training.optim import build_optimizer
from alignment.training.precision import Precision
from alignment.training.sharding import Replicated, shard
from alignment.training.trackers import TrackerFanOut


@dataclasses.dataclass
class Trained:
    """A model being trained, with its optimizer, learning-rate schedule and how both are sharded."""
    model: object
    optimizer: object
    scheduler: object
    sharding: Replicated


class Trainer:
    progress_name = "train"
    evaluate_at_start = False  # evaluate once before the first step of a fresh run (RL: the starting policy)

    def __init__(self, args, tokenizer, effective_args: Optional[dict] = None):
        init_distributed()
        self.args, self.tokenizer = args, tokenizer
        self.logger = MetricsLogger(args.output_dir, enabled=is_main_process(),
                                    trackers=TrackerFanOut(args, effective_args),
                                    first_files={"args.json": effective_args} if effective_args else None)
        self.guard = NonFiniteGuard(args.max_nonfinite_steps, args.output_dir)
        self.precision = Precision(args)
        if self.precision.notice() and is_main_process():
            print(self.precision.notice())
        self.trained: Dict[str, Trained] = {}
        self.global_step = 0
        self.total_steps = 1
        self.window: List[Dict[str, float]] = []  # metric rows of the steps since the last logged row
        self.best = BestModel(args.output_dir, args.metric_for_best_model or "loss", args.greater_is_better) \
            if args.load_best_model_at_end else None

    def add_trained(self, name: str, model, optimizer_steps: int, args=None) -> Trained:
        """Train `model` with AdamW under `args` (default: the run's training arguments) for `optimizer_steps`."""
        args = args or self.args
        optimizer, scheduler = build_optimizer(model, args, optimizer_steps, precision=self.precision)
        sharding = shard(model, optimizer, args)
        if sharding.describe() and is_main_process():
            print(f"{name}: {sharding.describe()}")
        self.precision.before_backward.append(sharding.before_backward)
        self.trained[name] = Trained(model, sharding.optimizer, scheduler, sharding)
        return self.trained[name]

    def whole_models(self):
        """A context in which every trained model holds its whole parameters (stage 3 slices them; a collective)."""
        stack = contextlib.ExitStack()
        for t in self.trained.values():
            stack.enter_context(t.sharding.whole())
        return stack

    # --- hooks ---------------------------------------------------------------------------------------------------
    def training_step(self) -> Dict[str, float]:
        raise NotImplementedError

    def evaluate(self) -> Dict[str, float]:
        return {}

    def has_eval_data(self) -> bool:
        return False

    def save(self, output_dir: str) -> None:
        raise NotImplementedError

    def after_step(self, metrics: Dict[str, float]) -> None:
        """After each step (global_step counts it), before its metrics are logged: may add to `metrics`."""

    def start_data_streams(self) -> None:
        """Open the data iterators (a resumed run skips the batches its checkpoint says were drawn)."""

    def trainer_state(self) -> dict:
        return {"nonfinite": self.guard.state_dict(), "log_window": self.window,
                "loss_scaler": self.precision.state_dict(),
                "best_model": self.best.state_dict() if self.best is not None else None}

    def load_trainer_state(self, state: dict) -> None:
        self.global_step = state["global_step"]
        self.guard.load_state_dict(state["nonfinite"])
        self.window = state.get("log_window", [])  # the next logged row averages the same steps as without a stop
        self.precision.load_state_dict(state.get("loss_scaler", {}))
        if self.best is not None and state.get("best_model"):
            self.best.load_state_dict(state["best_model"])

    def log_row(self, window: List[Dict[str, float]]) -> Dict[str, float]:
        return mean_rows(window)

    def finished(self, results: Dict[str, dict]) -> None:
        """At the end of a run that trained to its last step (not a benchmark), with train()'s result."""

    progress = None  # the run's tqdm bar while train() runs
    shown: Dict[str, str] = {}  # the last logged metrics on the bar

    def show_phase(self, **fields: str) -> None:
        """Put what the step is doing now (e.g. phase='generate', gen='512 tok/s') on the progress bar, after the
        last logged metrics; the bar's own ETA covers the run."""
        if self.progress is not None and not self.progress.disable:
            self.progress.set_postfix({**fields, **self.shown}, refresh=True)

    # --- the loop ------------------------------------------------------------------------------------------------
    def train(self) -> Dict[str, dict]:
        """Run to total_steps (from a checkpoint when resume_from_checkpoint asks); returns {"start": metrics of
        the evaluation before training (evaluate_at_start, fresh runs), "end": of the final one} (keys present
        when those evaluations ran)."""
        steps = self.stepwise()
        while True:
            try:
                next(steps)
            except StopIteration as end:
                return end.value

    def stepwise(self):
        """`train()` one step at a time: a generator that yields after each step (its logging, evaluation and
        checkpoint done) and returns train()'s result; runs that share a model interleave their steps with it."""
        args = self.args
        if self.best is not None and not self.has_eval_data():
            self.best = None
            if is_main_process():
                print("load_best_model_at_end: no evaluation data, so the final model is the last step's")
        self.start_data_streams()
        progress = self.progress = tqdm(total=self.total_steps, initial=self.global_step, desc=self.progress_name,
                                        dynamic_ncols=True, disable=hide_progress(args))
        results, speed = {}, Throughput() if args.benchmark else None  # benchmark: no evaluation, no saving
        evaluates = self.has_eval_data() and args.do_eval and speed is None
        if self.evaluate_at_start and self.global_step == 0 and evaluates:
            results["start"] = self.evaluate()
        log_every = 1 if speed is not None and not args.disable_tqdm else args.logging_steps  # as PaddleNLP
        while self.global_step < self.total_steps:
            started = time.perf_counter()
            self.window.append(self.training_step())
            if speed is not None:
                speed.record(time.perf_counter() - started, self.benchmark_counts())
            self.global_step += 1
            self.after_step(self.window[-1])
            progress.update(1)
            last = self.global_step == self.total_steps
            if self.due(log_every) or last:
                row = {**self.log_row(self.window), **(speed.interval(training_world()) if speed else {})}
                self.logger.log(self.global_step, row, echo=progress.write)
                self.shown = {k: f"{row[k]:.4g}" for k in ("loss", "reward/mean", "kl") if k in row}
                progress.set_postfix(self.shown)
                self.window = []
            if self.due(args.eval_steps) and evaluates and not last:
                self.consider_best(self.evaluate())
            if self.due(args.save_steps) and speed is None and not last:
                self.save_step_checkpoint()
            yield self.global_step
        progress.close()
        if speed is not None:
            return self.report_benchmark(speed)
        if evaluates:
            results["end"] = self.evaluate()
        with self.whole_models():
            self.save(args.output_dir)
        if self.best is not None:
            self.consider_best(results.get("end", {}), saved=True)
            line = self.best.restore(self.global_step, is_main_process())
            barrier()
            if line and is_main_process():
                print(line)
        self.logger.close()
        barrier()  # every rank ends together: none tears down while another still talks to it
        self.finished(results)
        return results

    def benchmark_counts(self) -> Optional[Dict[str, float]]:
        """benchmark: the samples, tokens and padded tokens the last step trained over all processes (a collective;
        None: the stage does not count them)."""
        return None

    def report_benchmark(self, speed: Throughput) -> dict:
        """benchmark: print PaddleNLP's [timelog] lines and every rank's peak memory; log them; save nothing."""
        held = {"peak_rss": peak_rss_gib(),
                "weights": tensors_gib(w for t in self.trained.values() for w in t.sharding.held_weights()),
                "adamw": tensors_gib(a for t in self.trained.values() for a in t.sharding.held_states())}
        ranks = gather_objects(held)
        summary = {**speed.summary(), **{f"benchmark/{k}_gib_max": max(r[k] for r in ranks) for k in held}}
        self.logger.log(self.global_step, summary)
        if is_main_process():
            print("\n".join(timelog_lines(summary, ranks)))
        self.logger.close()
        barrier()
        return {"benchmark": summary}

    def consider_best(self, metrics: Dict[str, float], saved: bool = False) -> None:
        """load_best_model_at_end: save the models to output_dir/best when this evaluation is the best so far
        (`saved`: the final models are already written; the best then stays where it is)."""
        if self.best is None or not metrics:
            return
        try:
            self.best.consider(metrics, self.global_step, (lambda folder: None) if saved else self.save_whole)
        except ValueError as err:
            raise TrainingStopped(str(err)) from None

    def save_whole(self, output_dir: str) -> None:
        with self.whole_models():
            self.save(output_dir)

    def due(self, every: int) -> bool:
        return every > 0 and self.global_step % every == 0

    def optimizer_step(self, *also_finite: float) -> List[float]:
        """One update of every trained model: gradients averaged over data ranks, their global norms checked with
        `also_finite` (e.g. the losses) by the NaN/inf guard (not finite: no model is updated and the step is
        counted), clipped to max_grad_norm, optimizers and schedules stepped, gradients cleared. Returns the
        gradient norms, in the order the models were added."""
        trained = list(self.trained.values())
        norms = []
        for t in trained:
            t.sharding.sync_gradients()
            self.precision.unscale(t.optimizer)  # fp16: back to the true gradients
            norms.append(t.sharding.gradient_norm())
        if self.precision.scaler is not None and all(map(math.isfinite, also_finite)) and \
                not all(map(math.isfinite, norms)):
            finite = False  # fp16 overflow of finite losses: the scaler lowers the loss scale, no NaN step counted
        else:
            finite = self.guard.check(self.global_step + 1, *norms, *also_finite)
        for t, norm in zip(trained, norms):
            if finite:
                t.sharding.clip(self.args.max_grad_norm, norm)
                with optimizer_threads():  # CPU: AdamW's OpenMP loops on every core (cpu_env.py)
                    t.sharding.step(self.precision)
                t.scheduler.step()
            t.optimizer.clear_grad()  # a skipped step's gradients are dropped too
        self.precision.update()
        if finite:
            self.guard.check_weights(self.global_step + 1, [w for t in trained for w in t.sharding.held_weights()])
        return norms

    # --- checkpoints (alignment/training/checkpointing.py) ---------------------------------------------------------
    def _checkpointed(self):
        return ({name: t.model for name, t in self.trained.items()},
                {name: (t.sharding, t.scheduler) for name, t in self.trained.items()})

    def save_step_checkpoint(self) -> None:
        with self.whole_models():
            save_checkpoint(self.args.output_dir, self.global_step, *self._checkpointed(), self.trainer_state(),
                            self.tokenizer.name_or_path, self.args.save_total_limit, layout_name())  # every rank
        barrier()

    def resume_if_asked(self) -> None:
        """Restore the checkpoint resume_from_checkpoint names (null: a fresh start)."""
        path = resolve_resume(self.args.output_dir, self.args.resume_from_checkpoint)
        if path is None:
            return
        with self.whole_models():
            state = load_checkpoint(path, *self._checkpointed(), layout=layout_name())
        try:
            self.load_trainer_state(state)
        except (KeyError, TypeError, ValueError) as err:
            raise ValueError(f"{path}/trainer_state.json: not a trainer state of this stage (bad or missing "
                             f"{err})") from None
        self.logger.resume_at(self.global_step)
        print(f"resumed from {path} at step {self.global_step}")


def mean_rows(rows: List[Dict[str, float]]) -> Dict[str, float]:
    """Key-wise mean of metric rows, each key's over the rows that have it."""
    keys = dict.fromkeys(k for row in rows for k in row)
    return {k: float(np.mean([r[k] for r in rows if k in r])) for k in keys}
