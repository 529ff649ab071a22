"""Stage 1, supervised fine-tuning.

    python alignment/sft/run_sft.py config/tiny/sft_argument.json [--key value ...]
"""
from __future__ import annotations

import os
import sys

if not __package__:  # run as a script from a checkout: make `alignment` importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from alignment import entry  # noqa: E402  first: this CPU's settings before paddle is imported (alignment/entry.py)

from alignment.config.data import DataArguments, LoRAArguments, ModelArguments  # noqa: E402
from alignment.config.training import TrainingArguments  # noqa: E402
from alignment.training import setup  # noqa: E402


def main(argv=None) -> dict:
    model_args, data_args, lora_args, train_args, run = setup.parse_arguments(
        argv, ModelArguments, DataArguments, LoRAArguments, TrainingArguments)
    if lora_args.lora_adapters:  # several adapters on one base (alignment/sft/multi_adapter.py)
        from alignment.sft import multi_adapter

        return multi_adapter.main(model_args, data_args, lora_args, train_args, run)

    from alignment.data.tokenized import SupervisedDataset, collate_supervised
    from alignment.sft.sft_trainer import SupervisedTrainer

    with setup.started(train_args, run):
        tokenizer, *raw = setup.load_inputs(model_args.tokenizer_path, data_args, train_args.seed, run)
        train_set, eval_set = (SupervisedDataset(r, tokenizer, data_args.max_length) if r is not None else None
                               for r in raw)
        print(setup.datasets_line("samples", train_set, eval_set))
        model = setup.load_trained_model("causal", model_args.model_name_or_path, run.layout, lora_args,
                                         recompute=train_args.recompute)
        trainer = SupervisedTrainer(train_args, model, tokenizer, train_set, eval_set,
                                    lambda items: collate_supervised(items, tokenizer.pad_token_id), run.effective)
    with setup.training_stops(trainer):
        results = trainer.train().get("end", {})
    if setup.benchmark_ended(train_args, "SFT"):
        return results
    final = os.path.join(train_args.output_dir, "model")
    print(f"\nSFT done: {trainer.global_step} steps; model saved to {final}" +
          (f"; eval loss {results['eval/loss']:.4f}" if "eval/loss" in results else ""))
    if lora_args.lora:
        print(f"LoRA adapter (PEFT layout); merge it into a full checkpoint with: python tools/merge_lora.py "
              f"--adapter {final} --output {final}-merged")
        final += "-merged"
    print(f"next: use it as model_name_or_path of the reward model, or actor_model_name_or_path of PPO ({final})")
    setup.end_processes(train_args)  # prints the wall time; a multi-process run exits here
    return results


if __name__ == "__main__":
    entry.run(main)
