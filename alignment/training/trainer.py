"""The skeleton every stage runs on. The step loop, the guarded optimizer step, logging, the evaluation and
checkpoint cadence, resuming and progress live here once; a stage fills in the hooks:

    training_step() -> metrics        one optimizer step's work (SFT / RM / DPO: a batch; RL: a rollout)
    evaluate() -> metrics             held-out evaluation, every eval_steps and at the end ({} when there is none)
    has_eval_data() -> bool           whether the end-of-run evaluation happens
    save(output_dir)                  the final models
    start_data_streams()              (re)open the data iterators, skipping what a resumed run already drew
    trainer_state() / load_trainer_state(state)   counters a resumed run needs besides models and optimizers
    log_row(window) -> metrics        one logged row from the steps since the last one (default: their mean)

What is trained is registered with `add_trained(name, model, ...)`: each gets an AdamW optimizer and schedule,
is stepped together by `optimizer_step()` and saved under `name` in step checkpoints. A stage's constructor ends
with `resume_if_asked()`, once everything a checkpoint restores exists (so a bad checkpoint fails before training).
"""
from __future__ import annotations

import dataclasses
import math
from typing import Dict, List, Optional

import numpy as np
from tqdm import tqdm

from alignment.cpu_env import optimizer_threads
from alignment.parallel.distributed import (average_gradients, barrier, init_distributed, is_main_process,
                                            layout_name)
from alignment.training.best_model import BestModel
from alignment.training.checkpointing import load_checkpoint, resolve_resume, save_checkpoint
from alignment.training.guard import NonFiniteGuard, TrainingStopped
from alignment.training.logger import MetricsLogger, hide_progress
from alignment.training.optim import build_optimizer, clip_gradients, global_grad_norm
from alignment.training.precision import Precision


@dataclasses.dataclass
class Trained:
    """A model being trained, with its optimizer and learning-rate schedule."""
    model: object
    optimizer: object
    scheduler: object


class Trainer:
    progress_name = "train"
    evaluate_at_start = False  # evaluate once before the first step of a fresh run (RL: the starting policy)

    def __init__(self, args, tokenizer, effective_args: Optional[dict] = None):
        init_distributed()
        self.args, self.tokenizer = args, tokenizer
        self.logger = MetricsLogger(args.output_dir, enabled=is_main_process(),
                                    use_visualdl=args.report_to != "none",
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
        optimizer, scheduler = build_optimizer(model, args or self.args, optimizer_steps, precision=self.precision)
        self.trained[name] = Trained(model, optimizer, scheduler)
        return self.trained[name]

    # --- hooks ---------------------------------------------------------------------------------------------------
    def training_step(self) -> Dict[str, float]:
        raise NotImplementedError

    def evaluate(self) -> Dict[str, float]:
        return {}

    def has_eval_data(self) -> bool:
        return False

    def save(self, output_dir: str) -> None:
        raise NotImplementedError

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
        args = self.args
        if self.best is not None and not self.has_eval_data():
            self.best = None
            if is_main_process():
                print("load_best_model_at_end: no evaluation data, so the final model is the last step's")
        self.start_data_streams()
        progress = self.progress = tqdm(total=self.total_steps, initial=self.global_step, desc=self.progress_name,
                                        dynamic_ncols=True, disable=hide_progress(args))
        results = {}
        if self.evaluate_at_start and self.global_step == 0 and self.has_eval_data() and args.do_eval:
            results["start"] = self.evaluate()
        while self.global_step < self.total_steps:
            self.window.append(self.training_step())
            self.global_step += 1
            progress.update(1)
            last = self.global_step == self.total_steps
            if self.due(args.logging_steps) or last:
                row = self.log_row(self.window)
                self.logger.log(self.global_step, row, echo=progress.write)
                self.shown = {k: f"{row[k]:.4g}" for k in ("loss", "reward/mean", "kl") if k in row}
                progress.set_postfix(self.shown)
                self.window = []
            if self.due(args.eval_steps) and not last:
                self.consider_best(self.evaluate())
            if self.due(args.save_steps) and not last:
                self.save_step_checkpoint()
        progress.close()
        if self.has_eval_data() and args.do_eval:
            results["end"] = self.evaluate()
        self.save(args.output_dir)
        if self.best is not None:
            self.consider_best(results.get("end", {}), saved=True)
            line = self.best.restore(self.global_step, is_main_process())
            barrier()
            if line and is_main_process():
                print(line)
        self.logger.close()
        barrier()  # every rank ends together: none tears down while another still talks to it
        return results

    def consider_best(self, metrics: Dict[str, float], saved: bool = False) -> None:
        """load_best_model_at_end: save the models to output_dir/best when this evaluation is the best so far
        (`saved`: the final models are already written; the best then stays where it is)."""
        if self.best is None or not metrics:
            return
        try:
            self.best.consider(metrics, self.global_step, (lambda folder: None) if saved else self.save)
        except ValueError as err:
            raise TrainingStopped(str(err)) from None

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
            average_gradients(t.model.parameters())
            self.precision.unscale(t.optimizer)  # fp16: back to the true gradients
            norms.append(global_grad_norm(t.model.parameters()))
        if self.precision.scaler is not None and all(map(math.isfinite, also_finite)) and \
                not all(map(math.isfinite, norms)):
            finite = False  # fp16 overflow of finite losses: the scaler lowers the loss scale, no NaN step counted
        else:
            finite = self.guard.check(self.global_step + 1, *norms, *also_finite)
        for t, norm in zip(trained, norms):
            if finite:
                clip_gradients(t.model.parameters(), self.args.max_grad_norm, norm)
                with optimizer_threads():  # CPU: AdamW's OpenMP loops on every core (cpu_env.py)
                    self.precision.step(t.optimizer)
                t.scheduler.step()
            t.optimizer.clear_grad()  # a skipped step's gradients are dropped too
        self.precision.update()
        if finite:
            self.guard.check_weights(self.global_step + 1, [t.model for t in trained])
        return norms

    # --- checkpoints (alignment/training/checkpointing.py) ---------------------------------------------------------
    def _checkpointed(self):
        return ({name: t.model for name, t in self.trained.items()},
                {name: (t.optimizer, t.scheduler) for name, t in self.trained.items()})

    def save_step_checkpoint(self) -> None:
        save_checkpoint(self.args.output_dir, self.global_step, *self._checkpointed(), self.trainer_state(),
                        self.tokenizer.name_or_path, self.args.save_total_limit, layout_name())  # every rank
        barrier()

    def resume_if_asked(self) -> None:
        """Restore the checkpoint resume_from_checkpoint names (null: a fresh start)."""
        path = resolve_resume(self.args.output_dir, self.args.resume_from_checkpoint)
        if path is None:
            return
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
