"""Stage 2, reward model: pairwise training on (better, worse) answers, or a process reward model on
step-labelled solutions (process_reward; alignment/rm/kinds.py).

    python alignment/rm/run_reward.py config/tiny/rm_argument.json [--key value ...]
"""
from __future__ import annotations

import os
import sys

if not __package__:  # run as a script from a checkout: make `alignment` importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from alignment import entry  # noqa: E402  first: this CPU's settings before paddle is imported (alignment/entry.py)

from types import SimpleNamespace  # noqa: E402

from alignment.config.data import DataArguments, LoRAArguments, ModelArguments  # noqa: E402
from alignment.config.reward import RewardArguments  # noqa: E402
from alignment.config.training import TrainingArguments  # noqa: E402
from alignment.rm.kinds import reward_kind  # noqa: E402
from alignment.training import setup  # noqa: E402


def main(argv=None) -> dict:
    model_args, data_args, reward_args, lora_args, train_args, run = setup.parse_arguments(
        argv, ModelArguments, DataArguments, RewardArguments, LoRAArguments, TrainingArguments)
    args = SimpleNamespace(model=model_args, data=data_args, reward=reward_args, lora=lora_args, train=train_args,
                           run=run)
    kind = reward_kind(reward_args)  # pairwise, or a process reward model (process_reward)
    # inputs, model and trainer
    with setup.started(train_args, run):
        tokenizer, train_raw, eval_raw = setup.load_inputs(model_args.tokenizer_path, data_args, train_args.seed, run)
        trainer = kind.trainer(args, tokenizer, train_raw, eval_raw)
    # training (held-out evaluation before and after)
    with setup.training_stops(trainer):
        results = trainer.train()
    if setup.benchmark_ended(train_args, "reward model"):
        return results
    # what was made and how to use it
    before, results = results.get("start", {}), results.get("end", {})
    kind.report(args, before, results, os.path.join(train_args.output_dir, "model"))
    setup.end_processes(train_args)  # prints the wall time; a multi-process run exits here
    return {**results, **{f"start_{k}": v for k, v in before.items()}}


if __name__ == "__main__":
    entry.run(main)
