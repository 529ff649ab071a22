"""One Tinker training model: LoRA adapters on a frozen base LLaMA, trained by `forward_backward` (gradients add
up over calls) and `optim_step` (one Adam step with the request's AdamParams, then the gradients are cleared),
saved and loaded as a PEFT adapter directory plus the Adam moments.

Adam (Tinker's AdamParams: learning_rate, beta1, beta2, eps, weight_decay decoupled, grad_clip_norm on the global
norm, 0 = off), per trained tensor p with gradient g at step t:
    g <- g * min(1, clip / ||g||_global)        m <- b1 m + (1 - b1) g        v <- b2 v + (1 - b2) g^2
    p <- p (1 - lr wd) - lr (m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps)
which is what paddle.optimizer.AdamW (and torch's AdamW) compute; the moments are kept here so that every step can
take the request's own hyperparameters.

A checkpoint directory: adapter_config.json + adapter_model.safetensors (PEFT layout, lora.py) and, for
`save_state`, optimizer.safetensors (exp_avg.<param>, exp_avg_sq.<param>, and "step").
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence

import numpy as np
import paddle
from safetensors import SafetensorError
from safetensors.numpy import load_file, save_file

from alignment.models import LlamaForCausalLM
from alignment.models.logprobs import gather_log_probs
from alignment.models.lora import apply_lora, load_adapter, read_adapter_config, save_adapter
from alignment.tinker_service.losses import LOSSES, LossInputError
from alignment.tinker_service.wire import Datum

ATTENTION = ("q_proj", "k_proj", "v_proj", "o_proj")
MLP = ("gate_proj", "up_proj", "down_proj")
OPTIMIZER_FILE = "optimizer.safetensors"
ADAM_DEFAULTS = {"learning_rate": 1e-4, "beta1": 0.9, "beta2": 0.95, "eps": 1e-12, "weight_decay": 0.0,
                 "grad_clip_norm": 0.0}  # tinker.types.AdamParams' defaults


class UserError(ValueError):
    """A request the server refuses (reported to the SDK as a failed request of category "user")."""


@dataclass
class BaseModel:
    name: str  # what clients pass as base_model
    path: str  # HF-layout checkpoint directory
    max_length: int  # tokens a datum or a sampled sequence may hold


def lora_targets(train_attn: bool, train_mlp: bool) -> List[str]:
    targets = (list(ATTENTION) if train_attn else []) + (list(MLP) if train_mlp else [])
    if not targets:
        raise UserError("LoRA needs train_attn or train_mlp (train_unembed alone is not supported here)")
    return targets


def lora_model(base: BaseModel, rank: int, alpha: float, targets: Sequence[str], seed: Optional[int]):
    """The base model with fresh adapters (A drawn with paddle.seed(seed) when given, B zero)."""
    model = LlamaForCausalLM.from_pretrained(base.path)
    if seed is not None:
        paddle.seed(seed)
    apply_lora(model, rank, alpha, 0.0, targets)
    return model


def datum_arrays(datum: Datum, max_length: int):
    """(input ids [N] int64, target ids [N] int64) of a datum; its model input and targets must align."""
    targets = datum.inputs.get("target_tokens")
    if targets is None:
        raise UserError("every datum needs loss_fn_inputs['target_tokens']")
    targets = np.asarray(targets).reshape(-1).astype(np.int64)
    if len(datum.tokens) != targets.shape[0] or not datum.tokens:
        raise UserError(f"a datum has {len(datum.tokens)} input tokens and {targets.shape[0]} target tokens; "
                        "they must be equal and non-zero (position i predicts target i)")
    if len(datum.tokens) > max_length:
        raise UserError(f"a datum of {len(datum.tokens)} tokens is longer than the model's {max_length}")
    return np.asarray(datum.tokens, np.int64), targets


class TrainingModel:
    def __init__(self, model_id: str, base: BaseModel, model, rank: int):
        self.model_id, self.base, self.model, self.rank = model_id, base, model, rank
        self.model.train()
        self.params = {name: p for name, p in model.named_parameters() if not p.stop_gradient}
        self.exp_avg: Dict[str, paddle.Tensor] = {}
        self.exp_avg_sq: Dict[str, paddle.Tensor] = {}
        self.step = 0
        self.vocab = model.config.vocab_size

    def forward_backward(self, data: List[Datum], loss_fn: str, config: dict, forward_only: bool):
        """-> ({"logprobs": per-datum target log-probs}, {"loss:sum": summed loss}); gradients add up unless
        forward_only."""
        if loss_fn not in LOSSES:
            raise UserError(f"loss_fn {loss_fn!r} is not supported here; supported: {', '.join(sorted(LOSSES))}")
        if not data:
            raise UserError("forward_backward needs at least one datum")
        arrays = [datum_arrays(d, self.base.max_length) for d in data]
        for ids, targets in arrays:
            if max(ids.max(), targets.max()) >= self.vocab or min(ids.min(), targets.min()) < 0:
                raise UserError(f"token ids must be in [0, {self.vocab})")
        total, logprobs = paddle.zeros([]), []
        with paddle.set_grad_enabled(not forward_only):
            for (ids, targets), datum in zip(arrays, data):
                logits = self.model(paddle.to_tensor(ids[None])).logits  # [1, N, V]
                lp = gather_log_probs(logits, paddle.to_tensor(targets[None]))[0]  # [N]
                try:
                    total = total + LOSSES[loss_fn](lp, datum.inputs, config)
                except LossInputError as err:
                    raise UserError(str(err)) from None
                logprobs.append(lp.detach().numpy())
            if not forward_only:
                total.backward()
        return {"logprobs": logprobs}, {"loss:sum": float(total)}

    @paddle.no_grad()
    def optim_step(self, params: dict) -> dict:
        hp = {**ADAM_DEFAULTS, **params}
        lr, b1, b2, eps, wd, clip = (float(hp[k]) for k in ("learning_rate", "beta1", "beta2", "eps",
                                                                "weight_decay", "grad_clip_norm"))
        grads = {name: p.grad for name, p in self.params.items() if p.grad is not None}
        norm = float(paddle.sqrt(sum((g.astype("float32") ** 2).sum() for g in grads.values()))) if grads else 0.0
        scale = min(1.0, clip / (norm + 1e-6)) if clip > 0 and norm > clip else 1.0
        self.step += 1
        for name, grad in grads.items():
            param, g = self.params[name], grad * scale
            m = self.exp_avg.get(name, paddle.zeros_like(param)) * b1 + g * (1 - b1)
            v = self.exp_avg_sq.get(name, paddle.zeros_like(param)) * b2 + g * g * (1 - b2)
            self.exp_avg[name], self.exp_avg_sq[name] = m, v
            update = (m / (1 - b1 ** self.step)) / (paddle.sqrt(v / (1 - b2 ** self.step)) + eps)
            param.set_value(param * (1 - lr * wd) - update * lr)
        for param in self.params.values():
            param.clear_gradient(False)
        return {"grad_norm:mean": norm, "learning_rate:mean": lr}

    def save(self, path: str, with_optimizer: bool) -> None:
        def optimizer_file(folder: str) -> None:
            tensors = {"step": np.asarray(self.step, np.int64)}
            for name in self.exp_avg:
                tensors[f"exp_avg.{name}"] = self.exp_avg[name].numpy()
                tensors[f"exp_avg_sq.{name}"] = self.exp_avg_sq[name].numpy()
            save_file(tensors, os.path.join(folder, OPTIMIZER_FILE))

        save_adapter(self.model, path, self.base.name, "CAUSAL_LM", extra_files=optimizer_file if with_optimizer
                     else None)

    def load(self, path: str, with_optimizer: bool) -> None:
        """Weights (and with_optimizer, the Adam moments and step) from a checkpoint of the same base and rank."""
        try:
            load_adapter(self.model, path)
        except (ValueError, FileNotFoundError) as err:
            raise UserError(str(err)) from None
        self.exp_avg, self.exp_avg_sq, self.step = {}, {}, 0
        if with_optimizer:
            file = os.path.join(path, OPTIMIZER_FILE)
            try:
                tensors = load_file(file)
            except (SafetensorError, OSError) as err:
                raise UserError(f"{file}: no readable optimizer state ({err}); save it with save_state") from None
            self.step = int(tensors.pop("step", 0))
            for key, value in tensors.items():
                kind, _, name = key.partition(".")
                if name not in self.params or kind not in ("exp_avg", "exp_avg_sq"):
                    raise UserError(f"{file}: tensor {key!r} belongs to no trained parameter")
                getattr(self, kind)[name] = paddle.to_tensor(value)


def checkpoint_shape(path: str) -> dict:
    """rank, alpha and targets of a checkpoint directory (to build a model it loads into)."""
    try:
        config = read_adapter_config(path)
    except (ValueError, FileNotFoundError) as err:
        raise UserError(str(err)) from None
    return {"rank": int(config["r"]), "alpha": float(config["lora_alpha"]), "targets": config["target_modules"],
            "base_model": config.get("base_model_name_or_path")}
