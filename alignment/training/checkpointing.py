"""Resumable step checkpoints, shared by every stage.

    <output_dir>/checkpoint-N/
        <model>/               each trained model in HF layout (e.g. model/, or policy/ and value/)
        <model>.optimizer.safetensors   AdamW state of that model, whole, under the whole model's parameter
                               names (alignment/training/optimizer_state.py), whatever the process layout: a
                               checkpoint resumes under any other layout
        <model>.scheduler.json learning-rate scheduler state
        rng_state.json         Python, numpy and Paddle RNG states
        trainer_state.json     global_step, batches drawn from each data stream, normaliser statistics, the
                               process layout the optimizer files belong to, ...
        manifest.json          size and sha256 of every other file, written last
    <output_dir>/latest        "checkpoint-N", rewritten only after checkpoint-N is complete

Everything is data (safetensors and JSON): nothing on the load path unpickles, so a crafted checkpoint cannot run
code. A checkpoint directory is built under a temporary name, fsynced and renamed (alignment/fileio.py), and
`latest` is replaced atomically afterwards, so a process killed at any point leaves the previous checkpoint
loadable. `resume_from_checkpoint: "auto"` takes the newest checkpoint under output_dir whose files match its
manifest (`latest` only names one of them, never a path elsewhere). Every rank calls save_checkpoint
(tensor-parallel weights and optimizer states are gathered, pipeline stages' and sharding ranks' sent to rank 0);
rank 0 writes. Checkpoints of versions before 2026-11 (pickled optimizer and RNG files) are refused.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
import random
import re
import shutil
from typing import Dict, List, Optional, Tuple

import numpy as np
import paddle

from safetensors.numpy import load_file, save_file

from alignment.fileio import atomic_directory, write_json_atomic, write_text_atomic
from alignment.parallel.distributed import is_main_process
from alignment.training.optimizer_state import load_whole_optimizer_state, whole_optimizer_state

STATE_FILE = "trainer_state.json"
RNG_FILE = "rng_state.json"
MANIFEST = "manifest.json"
LATEST = "latest"
_CHECKPOINT = re.compile(r"^checkpoint-(\d+)$")


def rng_state() -> dict:
    """Python, numpy and Paddle generator states as JSON-able data."""
    version, internal, gauss = random.getstate()
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    return {"python": [version, list(internal), gauss],
            "numpy": [kind, keys.tolist(), int(pos), int(has_gauss), float(cached)],
            "paddle": [_paddle_generator_state(g) for g in paddle.get_rng_state()]}


def _paddle_generator_state(generator) -> list:
    device, seed, offset, engine = generator.__getstate__()  # engine: the generator's text state as char codes
    return [device, seed, offset, bytes(engine).decode("ascii")]


def set_rng_state(state: dict) -> None:
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    kind, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((kind, np.array(keys, dtype=np.uint32), pos, has_gauss, cached))
    generators = paddle.get_rng_state()
    if len(generators) != len(state["paddle"]):
        raise ValueError(f"{len(state['paddle'])} Paddle generator states for {len(generators)} generators")
    for generator, (device, seed, offset, engine) in zip(generators, state["paddle"]):
        generator.__setstate__((device, seed, offset, list(engine.encode("ascii"))))
    paddle.set_rng_state(generators)


def write_rng_state(directory: str) -> None:
    write_json_atomic(os.path.join(directory, RNG_FILE), rng_state())


def write_manifest(directory: str) -> None:
    """manifest.json: {relative path: [size, sha256]} of every file under `directory`."""
    files = {}
    for root, _, names in os.walk(directory):
        for name in names:
            full = os.path.join(root, name)
            files[os.path.relpath(full, directory)] = [os.path.getsize(full), _sha256(full)]
    write_json_atomic(os.path.join(directory, MANIFEST), {"files": files})


def _sha256(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            digest.update(block)
    return digest.hexdigest()


def verify_checkpoint(path: str) -> Optional[str]:
    """None when every file the manifest lists is there (a regular file) with its size and hash; else what is wrong.
    A file the manifest does not list (a `.pdparams` dropped beside a model's weights, a link) raises ForeignFile:
    nothing this program did not write is ever read on resume."""
    if not os.path.exists(os.path.join(path, RNG_FILE)) and os.path.exists(os.path.join(path, "rng_state.pkl")):
        return ("written by an earlier version (pickled optimizer and RNG states, which could run code when "
                "loaded): resume it with that version, or start a new run from its model weights")
    try:
        with open(os.path.join(path, MANIFEST), encoding="utf-8") as f:
            files = json.load(f)["files"]
        present = _files_under(path)
        unlisted = sorted(set(present) - set(files) - {MANIFEST})
        if unlisted:
            raise ForeignFile(f"{path}: {unlisted[0]} is not in its {MANIFEST}: a file this program did not write "
                              f"(remove it, or resume from another checkpoint)")
        for name, (size, digest) in files.items():
            if present.get(name) != "file" or os.path.getsize(os.path.join(path, name)) != size:
                return f"{str(name)[:120]} is missing, not a regular file, or has the wrong size"
            if _sha256(os.path.join(path, name)) != digest:
                return f"{name} does not match its sha256"
    except ForeignFile:
        raise
    except (OSError, ValueError, KeyError, TypeError) as err:
        return f"unreadable {MANIFEST} ({err})"
    return None


class ForeignFile(ValueError):
    """A checkpoint holds a file its manifest does not list: someone else put it there. Resuming stops rather than
    skip to an older checkpoint (which would then be overwritten)."""


def _files_under(path: str) -> Dict[str, str]:
    """{relative path: "file" or "link"} of everything under `path` but its directories (links are not followed)."""
    found = {}
    for root, dirs, names in os.walk(path):
        for name in names + [d for d in dirs if os.path.islink(os.path.join(root, d))]:
            full = os.path.join(root, name)
            found[os.path.relpath(full, path)] = "link" if os.path.islink(full) else "file"
    return found


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
            write_manifest(tmp)
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
    """The checkpoint directory to resume from: `spec` is null, a checkpoint path, or "auto": the newest
    checkpoint-N under output_dir that verifies against its manifest (`latest` first when it names one of them;
    what is skipped is said), else none: a fresh start."""
    if spec is None:
        return None
    if spec != "auto":
        if not os.path.exists(os.path.join(spec, STATE_FILE)):
            raise ValueError(f"key 'resume_from_checkpoint': {spec} is not a complete checkpoint (no {STATE_FILE}); "
                             f"give a checkpoint-N directory or \"auto\"")
        problem = _verified(spec)
        if problem:
            raise ValueError(f"key 'resume_from_checkpoint': {spec}: {problem}")
        return spec
    for candidate in _auto_candidates(output_dir):
        path = os.path.join(output_dir, candidate)
        problem = _verified(path)
        if problem is None:
            return path
        print(f"resume: skipping {path}: {problem}")
    return None


def _verified(path: str) -> Optional[str]:
    try:
        return verify_checkpoint(path)
    except ForeignFile as err:
        raise ValueError(f"key 'resume_from_checkpoint': {err}") from None


def _auto_candidates(output_dir: str) -> List[str]:
    """checkpoint-N names, the one `latest` names first (only a bare checkpoint-N: never a path elsewhere)."""
    names = [f"checkpoint-{step}" for step in sorted(checkpoint_steps(output_dir), reverse=True)]
    pointer = os.path.join(output_dir, LATEST)
    if os.path.exists(pointer):
        with open(pointer, encoding="utf-8", errors="replace") as f:
            named = f.read().strip()
        if named in names:
            names.remove(named)
            names.insert(0, named)
        else:
            print(f"resume: ignoring {pointer}: {named[:80]!r} is not a checkpoint-N directory of {output_dir}")
    return names


def load_checkpoint(path: str, models: Dict[str, object], optimizers: Dict[str, Tuple], layout: str = "") -> dict:
    """Restore models, optimizers, schedulers and RNG states in place; return the trainer state. Weights and
    optimizer states load under any layout."""
    saved = _read_json(os.path.join(path, STATE_FILE))
    for model_name, model in models.items():
        model.load_checkpoint(os.path.join(path, model_name))
    for opt_name, (optimizer, scheduler) in optimizers.items():
        whole = os.path.join(path, f"{opt_name}.optimizer.safetensors")
        load_whole_optimizer_state(models[opt_name], optimizer, load_file(whole), whole)
        scheduler.set_state_dict(_read_json(os.path.join(path, f"{opt_name}.scheduler.json")))
    rng_file = os.path.join(path, RNG_FILE)
    try:
        set_rng_state(_read_json(rng_file))
    except (ValueError, KeyError, TypeError) as err:
        raise ValueError(f"{rng_file}: not an RNG state of this version ({err})") from None
    return saved


def _read_json(path: str):
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except ValueError as err:
        raise ValueError(f"{path}: not valid JSON ({err})") from None
