"""Stage 1, supervised fine-tuning.

    python alignment/sft/run_sft.py config/tiny/sft_argument.json [--key value ...]
"""
from __future__ import annotations

import os
import sys

if not __package__:  # run as a script from a checkout: make `alignment` importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from alignment.cpu_env import apply_cpu_defaults  # noqa: E402

apply_cpu_defaults()  # this CPU's thread and MKL settings, before paddle is imported

from alignment.config.data import DataArguments, LoRAArguments, ModelArguments  # noqa: E402
from alignment.config.training import TrainingArguments  # noqa: E402
from alignment.training.setup import (  # noqa: E402
    end_processes, load_raw, parse_arguments, start_processes, training_stops, user_errors)


def main(argv=None) -> dict:
    model_args, data_args, lora_args, train_args, effective = parse_arguments(
        argv, ModelArguments, DataArguments, LoRAArguments, TrainingArguments)

    from alignment.data.tokenized import SupervisedDataset, collate_supervised
    from alignment.models import LlamaForCausalLM, Tokenizer
    from alignment.models.lora import with_lora
    from alignment.sft.trainer import SupervisedTrainer
    from alignment.training.batches import set_seed

    layout = start_processes(train_args)
    set_seed(train_args.seed)
    with user_errors():
        tokenizer = Tokenizer.from_pretrained(model_args.tokenizer_name_or_path or model_args.model_name_or_path)
        train_raw, eval_raw = load_raw(data_args, train_args.seed)
        train_set = SupervisedDataset(train_raw, tokenizer, data_args.max_length)
        eval_set = SupervisedDataset(eval_raw, tokenizer, data_args.max_length) if eval_raw is not None else None
        print(f"train: {len(train_set)} samples {train_set.stats}" +
              (f"; eval: {len(eval_set)} samples {eval_set.stats}" if eval_set is not None else ""))
        if layout.pipeline > 1:
            from alignment.models import LlamaConfig
            from alignment.wrappers.pipeline import load_pipeline_model

            if lora_args.lora:
                raise ValueError("key 'lora': LoRA with pipeline_parallel_degree > 1 is not supported")
            model = load_pipeline_model(LlamaConfig, model_args.model_name_or_path, "causal", layout.pipeline,
                                        recompute=train_args.recompute)
        else:
            model = with_lora(LlamaForCausalLM.from_pretrained(model_args.model_name_or_path,
                                                               recompute=train_args.recompute), lora_args)
        trainer = SupervisedTrainer(train_args, model, tokenizer, train_set, eval_set,
                                    lambda items: collate_supervised(items, tokenizer.pad_token_id), effective)
    with training_stops():
        results = trainer.train().get("end", {})
    final = os.path.join(train_args.output_dir, "model")
    print(f"\nSFT done: {trainer.global_step} steps; model saved to {final}" +
          (f"; eval loss {results['eval/loss']:.4f}" if "eval/loss" in results else ""))
    if lora_args.lora:
        print(f"LoRA adapter (PEFT layout); merge it into a full checkpoint with: python tools/merge_lora.py "
              f"--adapter {final} --output {final}-merged")
        final += "-merged"
    print(f"next: use it as model_name_or_path of the reward model, or actor_model_name_or_path of PPO ({final})")
    end_processes(train_args)  # prints the wall time; a multi-process run exits here
    return results


if __name__ == "__main__":
    main()
