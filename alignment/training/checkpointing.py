"""Resumable step checkpoints, shared by every stage.

    <output_dir>/checkpoint-N/
        <model>/               each trained model in HF layout (e.g. model/, or policy/ and value/)
        <model>.optimizer.safetensors   AdamW state of that model, whole, under the whole model's parameter
                               names (alignment/training/optimizer_state.py), whatever the process layout: a
                               checkpoint resumes under any other layout
        <model>.scheduler.json learning-rate scheduler state
        rng_state.pkl          Python, numpy and Paddle RNG states
        trainer_state.json     global_step, batches drawn from each data stream, normaliser statistics, the
                               process layout the optimizer files belong to, ...
    <output_dir>/latest        "checkpoint-N", rewritten only after checkpoint-N is complete

A checkpoint directory is built under a temporary name, fsynced and renamed (alignment/fileio.py), and `latest`
is replaced atomically afterwards, so a process killed at any point leaves the previous checkpoint loadable and
`resume_from_checkpoint: "auto"` finds it. Every rank calls save_checkpoint (tensor-parallel weights and optimizer
states are gathered, pipeline stages' and sharding ranks' sent to rank 0); rank 0 writes. Checkpoints of earlier
versions (<model>.optimizer, one file or one per rank) still load, the per-rank ones under their own layout.
"""
from __future__ import annotations

import contextlib
import json
import os
import pickle
import random
import re
import shutil
from typing import Dict, Optional, Tuple

import numpy as np
import paddle

from safetensors.numpy import load_file, save_file

from alignment.fileio import atomic_directory, write_json_atomic, write_text_atomic
from alignment.parallel.distributed import is_main_process, rank, split_optimizer_states
from alignment.training.optimizer_state import load_whole_optimizer_state, whole_optimizer_state

STATE_FILE = "trainer_state.json"
RNG_FILE = "rng_state.pkl"
LATEST = "latest"
_CHECKPOINT = re.compile(r"^checkpoint-(\d+)$")


def rng_state() -> dict:
    return {"python": random.getstate(), "numpy": np.random.get_state(), "paddle": paddle.get_rng_state()}


def set_rng_state(state: dict) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    paddle.set_rng_state(state["paddle"])


def write_rng_state(directory: str) -> None:
    with open(os.path.join(directory, RNG_FILE), "wb") as f:
        pickle.dump(rng_state(), f)


def portable_optimizer_state(model, optimizer) -> dict:
    """The optimizer's state with Paddle's generated parameter names (e.g. linear_3.w_0, which depend on how many
    layers the process built before) replaced by the model's structured names, so a fresh process can load it."""
    by_generated = {p.name: n for n, p in model.named_parameters()}
    out = {}
    for key, value in optimizer.state_dict().items():
        owner = max((g for g in by_generated if key.startswith(g + "_")), key=len, default=None)
        out[f"param:{by_generated[owner]}{key[len(owner):]}" if owner else key] = value
    return out


def load_portable_optimizer_state(model, optimizer, state: dict) -> None:
    by_structured = {n: p.name for n, p in model.named_parameters()}
    restored = {}
    for key, value in state.items():
        if key.startswith("param:"):
            name = max((n for n in by_structured if key[6:].startswith(n + "_")), key=len)
            key = by_structured[name] + key[6 + len(name):]
        restored[key] = value
    optimizer.set_state_dict(restored)


def save_checkpoint(output_dir: str, step: int, models: Dict[str, object], optimizers: Dict[str, Tuple],
                    state: dict, tokenizer_dir: Optional[str] = None, keep: int = 0, layout: str = "") -> str:
    """Write checkpoint-`step` atomically, point `latest` at it, then keep only the newest `keep` (0 = all).
    `optimizers` maps a model name to that model's (optimizer, scheduler). Called by every rank."""
    name = f"checkpoint-{step}"
    path = os.path.join(output_dir, name)
    with (atomic_directory(path) if is_main_process() else contextlib.nullcontext("")) as tmp:
        for model_name, model in models.items():  # a collective for tensor-parallel models; rank 0 writes
            model.save_pretrained(os.path.join(tmp, model_name), tokenizer_dir=tokenizer_dir)
        for opt_name, (optimizer, scheduler) in optimizers.items():
            whole = whole_optimizer_state(models[opt_name], optimizer)  # a collective
            if tmp:
                save_file({k: np.ascontiguousarray(v) for k, v in whole.items()},
                          os.path.join(tmp, f"{opt_name}.optimizer.safetensors"))
                write_json_atomic(os.path.join(tmp, f"{opt_name}.scheduler.json"), scheduler.state_dict())
        if tmp:
            write_rng_state(tmp)
            write_json_atomic(os.path.join(tmp, STATE_FILE), {"global_step": step, "layout": layout, **state})
    if not is_main_process():
        return path
    write_text_atomic(os.path.join(output_dir, LATEST), name + "\n")
    if keep > 0:
        for old in sorted(checkpoint_steps(output_dir))[:-keep]:
            shutil.rmtree(os.path.join(output_dir, f"checkpoint-{old}"), ignore_errors=True)
    return path


def checkpoint_steps(output_dir: str) -> list:
    """Steps of the complete checkpoints (those with a trainer_state.json) under output_dir."""
    if not os.path.isdir(output_dir):
        return []
    steps = []
    for entry in os.listdir(output_dir):
        match = _CHECKPOINT.match(entry)
        if match and os.path.exists(os.path.join(output_dir, entry, STATE_FILE)):
            steps.append(int(match.group(1)))
    return steps


def resolve_resume(output_dir: str, spec: Optional[str]) -> Optional[str]:
    """The checkpoint directory to resume from: `spec` is null, a checkpoint path, or "auto" (the one `latest`
    names, else the highest complete checkpoint-N, else none: a fresh start)."""
    if spec is None:
        return None
    if spec == "auto":
        pointer = os.path.join(output_dir, LATEST)
        if os.path.exists(pointer):
            candidate = os.path.join(output_dir, open(pointer, encoding="utf-8").read().strip())
            if os.path.exists(os.path.join(candidate, STATE_FILE)):
                return candidate
        steps = checkpoint_steps(output_dir)
        return os.path.join(output_dir, f"checkpoint-{max(steps)}") if steps else None
    if not os.path.exists(os.path.join(spec, STATE_FILE)):
        raise ValueError(f"key 'resume_from_checkpoint': {spec} is not a complete checkpoint (no {STATE_FILE}); "
                         f"give a checkpoint-N directory or \"auto\"")
    return spec


def load_checkpoint(path: str, models: Dict[str, object], optimizers: Dict[str, Tuple], layout: str = "") -> dict:
    """Restore models, optimizers, schedulers and RNG states in place; return the trainer state. Weights and
    optimizer states load under any layout (earlier versions' per-rank optimizer files: under their own)."""
    with open(os.path.join(path, STATE_FILE), encoding="utf-8") as f:
        saved = json.load(f)
    for model_name, model in models.items():
        model.load_checkpoint(os.path.join(path, model_name))
    for opt_name, (optimizer, scheduler) in optimizers.items():
        whole = os.path.join(path, f"{opt_name}.optimizer.safetensors")
        if os.path.exists(whole):
            load_whole_optimizer_state(models[opt_name], optimizer, load_file(whole), whole)
            with open(os.path.join(path, f"{opt_name}.scheduler.json"), encoding="utf-8") as f:
                scheduler.set_state_dict(json.load(f))
        else:
            _load_legacy_optimizer(path, opt_name, models[opt_name], optimizer, scheduler, saved, layout)
    with open(os.path.join(path, RNG_FILE), "rb") as f:
        set_rng_state(pickle.load(f))
    return saved


def _load_legacy_optimizer(path, opt_name, model, optimizer, scheduler, saved: dict, layout: str) -> None:
    """<model>.optimizer (paddle.save of the portable state; one per rank, .rank-R, under the layout it names)."""
    if split_optimizer_states() or saved.get("layout"):
        if saved.get("layout", "") != layout:
            raise ValueError(f"key 'resume_from_checkpoint': {path} holds per-rank optimizer states of the layout "
                             f"'{saved.get('layout', '')}' (an earlier version's format); resume it with that "
                             f"layout, not '{layout}'")
    file = os.path.join(path, f"{opt_name}.optimizer")
    if split_optimizer_states():
        file += f".rank-{rank()}"
    load_portable_optimizer_state(model, optimizer, paddle.load(file))
    scheduler.set_state_dict(paddle.load(os.path.join(path, f"{opt_name}.scheduler")))
