"""RL of several LoRA adapters on one frozen base in one run (key `lora_adapters`, config/lora_adapters.py; the SFT
stage's is alignment/sft/multi_adapter.py): each entry may have its own reward_funcs and reward_weights, data, seed,
learning rate, steps and LoRA shape, and trains and saves under output_dir/<name>/ as a run of its own with those
keys would, bit for bit.

Each adapter's trainer is built exactly as its own run builds it (seeded with its seed, its data, its policy with
its adapters, its reward, a critic or reward model of its own when the recipe has them); then every base parameter
of its policy is replaced by the first adapter's policy's parameter of the same name (the same values, read from
the same checkpoint), which drops its copy of the base. So one base stays in memory once the trainers are built
(two while one is being built). A policy's reference is itself with its adapters off, so the reference is shared
too. The steps go round robin, one optimizer step of each adapter in turn (Trainer.stepwise), each adapter's random
stream (Python's, numpy's and Paddle's generator states) swapped in around its own work.
"""
from __future__ import annotations

import dataclasses
from typing import Dict, Iterator, Tuple

from alignment.config.lora_adapters import adapter_runs
from alignment.training import setup
from alignment.training.batches import rng_states, set_rng_states


def own_parameters(model) -> Iterator[Tuple[str, object, str, object]]:
    """(full name, layer, attribute, parameter) of every parameter each layer holds itself (a tied one per holder)."""
    for prefix, layer in model.named_sublayers(include_self=True):
        for attr, param in layer.named_parameters(include_sublayers=False):
            yield (f"{prefix}.{attr}" if prefix else attr), layer, attr, param


def share_base(model, base) -> int:
    """Point every parameter of `model` that is not an adapter's at `base`'s of the same name; -> how many."""
    shared = {name: param for name, _, _, param in own_parameters(base)}
    count = 0
    for name, layer, attr, param in list(own_parameters(model)):
        if attr in ("lora_A", "lora_B") or name not in shared or shared[name] is param:
            continue
        if tuple(shared[name].shape) != tuple(param.shape) or shared[name].dtype != param.dtype:
            raise ValueError(f"lora_adapters: {name} differs between the adapters' base models")
        setattr(layer, attr, shared[name])
        count += 1
    return count


def train_adapters(parsed, build_trainer, training_errors) -> Dict[str, dict]:
    """build_trainer(parsed) -> (trainer, mailbox) and training_errors(trainer) are stage.py's."""
    model_args, data_args, ppo_args, distill_args, env_args, async_args, lora_args, eval_args, monitor_args, \
        train_args, run = parsed
    try:
        if run.layout.processes > 1 or async_args.asynchronous:
            raise ValueError("key 'lora_adapters': several adapters train in one synchronous process only; "
                             "leave 'asynchronous' off and start one process")
        runs = adapter_runs({"train": train_args, "data": data_args, "lora": lora_args, "ppo": ppo_args})
    except ValueError as err:
        setup.fail(err)
    adapters, base = [], None
    for adapter_run in runs:
        args = adapter_run.args
        if run.argument_dir is not None:
            setup.paths_beside_the_file(args["data"], run.argument_dir)
        effective = {**run.effective, "output_dir": adapter_run.train.output_dir, "lora_adapters": [],
                     **adapter_run.entry}
        trainer, _ = build_trainer((model_args, args["data"], args["ppo"], distill_args, env_args, async_args,
                                    args["lora"], eval_args, monitor_args, args["train"],
                                    dataclasses.replace(run, effective=effective)))
        if base is None:
            base = trainer.actor
        else:
            share_base(trainer.actor, base)
        adapters.append([adapter_run, trainer, rng_states(), trainer.stepwise()])
    results, waiting = {}, list(adapters)
    while waiting:
        for adapter in list(waiting):
            adapter_run, trainer, rng, steps = adapter
            set_rng_states(rng)
            with training_errors(trainer):
                try:
                    next(steps)
                except StopIteration as end:
                    results[adapter_run.name] = end.value or {}
                    waiting.remove(adapter)
            adapter[2] = rng_states()
    for adapter_run, trainer, _, _ in adapters:
        print(f"{adapter_run.name}: {trainer.global_step} steps; policy's LoRA adapter (PEFT layout) saved under "
              f"{adapter_run.train.output_dir}")
    setup.end_processes(train_args)
    return results
