"""SFT of several LoRA adapters on one frozen base in one run (key `lora_adapters`, config/lora_adapters.py): one
base model in memory, the adapters' optimizer steps taken in turn, each adapter trained and saved as a run of its
own with its entry's keys would train and save it (output_dir/<name>/: metrics, checkpoints, model/ in PEFT's
layout), bit for bit.

- Layers: each adapter has its own LoRALinear layers sharing the base's weight and bias Parameters; the adapter
  whose turn it is has its layers put into the model (`SharedBase.running`), so its trainer sees a LoRA model as in
  a run of its own: its optimizer holds its A and B only, its saves write its adapter.
- Random numbers: each adapter has its own stream (Python's, numpy's and Paddle's generator states), swapped in
  around all it does. A run of its own seeds them with its seed, tokenizes its data, builds the model (whose
  initialisation draws from Paddle's generator before the checkpoint's weights replace it) and then draws its
  adapters' A. Here each adapter's stream goes the same way: seeded, its data loaded, a model loaded from the base
  checkpoint; that model is dropped before the next adapter's loads, and the last one is kept as the shared base,
  so no two models are held at once.
- Steps: round robin over the adapters, one optimizer step each (Trainer.stepwise), until each has run its steps.
"""
from __future__ import annotations

import contextlib
import dataclasses
import os
from typing import Dict, List

from alignment.config.lora_adapters import AdapterRun, adapter_runs
from alignment.models.lora import add_lora, lora_layers, set_sublayer
from alignment.training import setup
from alignment.training.batches import rng_states, set_rng_states, set_seed


@dataclasses.dataclass
class Adapter:
    run: AdapterRun
    rng: tuple  # (random, numpy, paddle) generator states of its stream
    layers: Dict[str, object] = dataclasses.field(default_factory=dict)  # module path -> its LoRALinear
    lora_config: dict = None
    trainer: object = None
    steps: object = None  # its trainer's stepwise() generator


class SharedBase:
    """One base model; `running(adapter)` puts that adapter's layers and random stream in place for a block."""

    def __init__(self, model):
        self.model = model
        self.plain = {name: layer for name, layer in model.named_sublayers()}  # the Linear layers adapters wrap

    def add(self, adapter: Adapter) -> None:
        """Create the adapter's layers (as `add_lora` does in a run of its own) from its stream."""
        set_rng_states(adapter.rng)
        add_lora(self.model, adapter.run.args["lora"])
        adapter.layers, adapter.lora_config = lora_layers(self.model), self.model.lora_config
        adapter.rng = rng_states()
        self._restore(adapter)

    @contextlib.contextmanager
    def running(self, adapter: Adapter):
        for name, layer in adapter.layers.items():
            set_sublayer(self.model, name, layer)
        self.model.lora_config = adapter.lora_config
        set_rng_states(adapter.rng)
        try:
            yield
        finally:
            adapter.rng = rng_states()
            self._restore(adapter)

    def _restore(self, adapter: Adapter) -> None:
        for name in adapter.layers:
            set_sublayer(self.model, name, self.plain[name])
        self.model.lora_config = None


def prepare(runs: List[AdapterRun], model_args, run):
    """(adapters with their data and streams, the shared base): each adapter's stream seeded and advanced as its
    own run's would be up to its adapters' creation."""
    from alignment.data.tokenized import SupervisedDataset

    adapters, data, model = [], [], None
    for adapter_run in runs:
        if run.argument_dir is not None:  # an entry's relative data paths as the run's own
            setup.paths_beside_the_file(adapter_run.args["data"], run.argument_dir)
        set_seed(adapter_run.train.seed)
        data_args = adapter_run.args["data"]
        tokenizer, *raw = setup.load_inputs(model_args.tokenizer_path, data_args, adapter_run.train.seed, run)
        sets = [SupervisedDataset(r, tokenizer, data_args.max_length) if r is not None else None for r in raw]
        print(f"{adapter_run.name}: " + setup.datasets_line("samples", *sets))
        model = None  # the previous adapter's model goes before this one loads
        model = setup.load_trained_model("causal", model_args.model_name_or_path, run.layout,
                                         dataclasses.replace(adapter_run.args["lora"], lora=False),
                                         recompute=adapter_run.train.recompute)
        adapters.append(Adapter(adapter_run, rng_states()))
        data.append((tokenizer, *sets))
    return adapters, data, SharedBase(model)


def main(model_args, data_args, lora_args, train_args, run) -> Dict[str, dict]:
    from alignment.data.tokenized import collate_supervised
    from alignment.sft.sft_trainer import SupervisedTrainer

    try:
        runs = adapter_runs({"train": train_args, "data": data_args, "lora": lora_args})
    except ValueError as err:
        setup.fail(err)
    with setup.started(train_args, run):
        adapters, data, base = prepare(runs, model_args, run)
        for adapter, (tokenizer, train_set, eval_set) in zip(adapters, data):
            base.add(adapter)
            effective = {**run.effective, "output_dir": adapter.run.train.output_dir, "lora_adapters": [],
                         **adapter.run.entry}
            with base.running(adapter):
                adapter.trainer = SupervisedTrainer(
                    adapter.run.train, base.model, tokenizer, train_set, eval_set,
                    lambda items, pad=tokenizer.pad_token_id: collate_supervised(items, pad), effective)
                adapter.steps = adapter.trainer.stepwise()
    results, waiting = {}, list(adapters)
    with setup.training_stops():
        while waiting:
            for adapter in list(waiting):
                with base.running(adapter):
                    try:
                        next(adapter.steps)
                    except StopIteration as end:
                        results[adapter.run.name] = (end.value or {}).get("end", {})
                        waiting.remove(adapter)
    for adapter in adapters:
        print(f"{adapter.run.name}: {adapter.trainer.global_step} steps; LoRA adapter (PEFT layout) saved to "
              f"{os.path.join(adapter.run.train.output_dir, 'model')}")
    print("serve them together: alignment-serve --model " + model_args.model_name_or_path + "".join(
        f" --adapter {a.run.name}={os.path.join(a.run.train.output_dir, 'model')}" for a in adapters))
    setup.end_processes(train_args)
    return results
