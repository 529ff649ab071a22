"""`lora_adapters`: several LoRA adapters trained in one run on one frozen base, each an entry of its own:

    "lora": true,
    "lora_adapters": [
      {"name": "math", "train_datasets": "alpaca:1.0:data/math.jsonl", "learning_rate": 1e-3, "seed": 1},
      {"name": "chat", "train_datasets": "alpaca:1.0:data/chat.jsonl", "lora_rank": 16}
    ]

An entry's keys replace the run's keys of the same name for that adapter (ADAPTER_KEYS); the adapter trains and
saves under output_dir/<name>/ as a run with those keys would. Pure Python."""
from __future__ import annotations

import dataclasses
import re
from typing import Dict, List, NamedTuple

from alignment.inputs.keys import (FINITE, POSITIVE_INT, POSITIVE_NUMBER, TEXT, Kind, either, integer, key_problems,
                                   list_of)

DATASETS = either(TEXT, list_of(TEXT, non_empty=True), Kind("an object", lambda v: isinstance(v, dict)))
# key -> (its kind, the argument class that holds it: "train", "data", "lora" or "ppo")
ADAPTER_KEYS = {"train_datasets": (DATASETS, "data"), "eval_datasets": (DATASETS, "data"),
                "learning_rate": (POSITIVE_NUMBER, "train"), "seed": (integer(0), "train"),
                "max_steps": (integer(-1), "train"), "lora_rank": (POSITIVE_INT, "lora"),
                "lora_alpha": (POSITIVE_NUMBER, "lora"), "lora_target_modules": (list_of(TEXT, non_empty=True), "lora"),
                "reward_funcs": (list_of(TEXT), "ppo"), "reward_weights": (list_of(FINITE), "ppo")}
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")


def check_lora_adapters(entries: list, lora: bool, lora_path) -> None:
    """Raise ValueError naming the key, the entry and the problem."""
    if not entries:
        return
    if not lora:
        raise ValueError("key 'lora_adapters' needs 'lora': true (each entry trains a LoRA adapter)")
    if lora_path:
        raise ValueError("key 'lora_adapters': the adapters start fresh; leave 'lora_path' unset")
    names = []
    for index, entry in enumerate(entries):
        where = f"key 'lora_adapters' entry {index}"
        kinds = {"name": TEXT, **{key: kind for key, (kind, _) in ADAPTER_KEYS.items()}}
        unknown = sorted(set(entry) - set(kinds))
        if unknown:
            raise ValueError(f"{where}: unknown key {unknown[0]!r}; an entry takes {', '.join(kinds)}")
        problems = key_problems(entry, kinds, required=("name",))
        if problems:
            raise ValueError(f"{where}: {'; '.join(problems)}")
        if not NAME.fullmatch(entry["name"]):
            raise ValueError(f"{where}: name {entry['name']!r} must be letters, digits, '.', '_' and '-' (it names "
                             f"the adapter's directory under output_dir)")
        names.append(entry["name"])
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise ValueError(f"key 'lora_adapters': the name {twice[0]!r} is given twice")


class AdapterRun(NamedTuple):
    """One adapter's arguments: the run's instances ({"train": ..., "data": ..., "lora": ..., "ppo": ...}) with the
    entry's keys, output_dir/<name> and no lora_adapters; `entry`: the keys the entry changed."""
    name: str
    args: Dict[str, object]
    entry: Dict[str, object]

    @property
    def train(self):
        return self.args["train"]


def adapter_runs(instances: Dict[str, object]) -> List[AdapterRun]:
    """The adapters of instances["lora"].lora_adapters; ValueError for an entry key this stage does not have."""
    train, lora = instances["train"], instances["lora"]
    runs = []
    for index, entry in enumerate(lora.lora_adapters):
        changes = {kind: {} for kind in instances}
        changes["train"]["output_dir"] = f"{train.output_dir}/{entry['name']}"
        changes["lora"].update(lora_adapters=[], lora_path=None)
        for key, value in entry.items():
            if key != "name":
                kind = ADAPTER_KEYS[key][1]
                if kind not in changes:
                    raise ValueError(f"key 'lora_adapters' entry {index}: {key!r} is not a key of this stage")
                changes[kind][key] = value
        runs.append(AdapterRun(entry["name"], {kind: dataclasses.replace(instance, **changes[kind])
                                               for kind, instance in instances.items()},
                               {k: v for k, v in entry.items() if k != "name"}))
    return runs
