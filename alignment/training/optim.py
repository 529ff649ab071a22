"""AdamW with warmup + linear / cosine / constant learning-rate schedules and global-norm clipping.

Clipping is done by the trainers (`clip_gradients`, after gradients are averaged over data ranks) rather than by
the optimizer, so the norm is the whole model's under tensor parallelism and sharding too, and it is the same
number the NaN/inf guard checks and the logs show.

The norm is one squared_l2_norm kernel per gradient (alignment/parallel/distributed.py; bitwise the old square +
sum) and clipping is skipped when the norm is within bounds. A merged AdamW (one merged_adam_ for all parameters,
0.22 -> 0.17 s a step on SmolLM2-135M) was measured and not kept: it rounds a few ulps differently from adamw_, and
the 2-process DPO run then no longer matched the 1-process one within the layout tests' tolerance.
Figures: docs/performance.md, "SmolLM2-135M against transformers".
"""
from __future__ import annotations

import math

import paddle

from alignment.config.training import TrainingArguments
from alignment.parallel.distributed import grad_norm_squares


def lr_factor(step: int, total_steps: int, warmup_steps: int, schedule: str, min_ratio: float) -> float:
    """Multiplier of the peak learning rate at `step` (0-based optimizer step)."""
    if warmup_steps > 0 and step < warmup_steps:
        return (step + 1) / warmup_steps
    if schedule in ("constant", "constant_with_warmup"):
        return 1.0
    progress = min(1.0, (step - warmup_steps) / max(1, total_steps - warmup_steps))
    if schedule == "linear":
        decay = 1.0 - progress
    elif schedule == "cosine":
        decay = 0.5 * (1.0 + math.cos(math.pi * progress))
    else:
        raise ValueError(f"unknown lr_scheduler_type {schedule!r}")
    return min_ratio + (1.0 - min_ratio) * decay


def warmup_steps_for(args: TrainingArguments, total_steps: int) -> int:
    return args.warmup_steps if args.warmup_steps > 0 else int(args.warmup_ratio * total_steps)


def build_optimizer(model: paddle.nn.Layer, args: TrainingArguments, total_steps: int,
                    learning_rate: float = None, weight_decay: float = None, precision=None):
    """Return (optimizer, scheduler). Norm weights and biases get no weight decay. `precision`
    (training/precision.py) decorates model and optimizer for AMP O2 before any sharding wrapper
    (training/sharding.py)."""
    peak = args.learning_rate if learning_rate is None else learning_rate
    decay = args.weight_decay if weight_decay is None else weight_decay
    warmup = warmup_steps_for(args, total_steps)
    min_ratio = args.min_learning_rate / peak if peak > 0 else 0.0
    scheduler = paddle.optimizer.lr.LambdaDecay(
        peak, lambda step: lr_factor(step, total_steps, warmup, args.lr_scheduler_type, min_ratio))
    no_decay = {p.name for n, p in model.named_parameters() if p.ndim == 1 or n.endswith("norm.weight")}
    optimizer = paddle.optimizer.AdamW(
        learning_rate=scheduler,
        parameters=[p for p in model.parameters() if not p.stop_gradient],
        beta1=args.adam_beta1,
        beta2=args.adam_beta2,
        epsilon=args.adam_epsilon,
        weight_decay=decay,
        apply_decay_param_fun=lambda name: name not in no_decay,
    )
    if precision is not None:
        model, optimizer = precision.decorate(model, optimizer)
    return optimizer, scheduler


def global_grad_norm(parameters) -> float:
    """L2 norm of the whole model's gradient (before clipping): checked by the NaN/inf guard, logged, clipped to."""
    return math.sqrt(grad_norm_squares(parameters))


def clip_gradients(parameters, max_norm: float, norm: float) -> None:
    """Scale the gradients by max_norm / max(norm, max_norm), as paddle.nn.ClipGradByGlobalNorm does (nothing to
    do when that is 1: the norm is within bounds)."""
    clip_tensors([param.grad for param in parameters], max_norm, norm)


def clip_tensors(grads, max_norm: float, norm: float) -> None:
    """clip_gradients of gradient tensors (None entries skipped)."""
    if max_norm <= 0 or not norm > max_norm:
        return
    scale = max_norm / norm
    with paddle.no_grad():
        for grad in grads:
            if grad is not None:
                grad.scale_(scale)
