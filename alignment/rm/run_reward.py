"""Stage 2, reward model: pairwise training on (better, worse) answers.

    python alignment/rm/run_reward.py config/tiny/rm_argument.json [--key value ...]
"""
from __future__ import annotations

import os
import sys

if not __package__:  # run as a script from a checkout: make `alignment` importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from alignment.cpu_env import apply_cpu_defaults  # noqa: E402

apply_cpu_defaults()  # this CPU's thread and MKL settings, before paddle is imported

from alignment.config.data import DataArguments, LoRAArguments, ModelArguments  # noqa: E402
from alignment.config.reward import RewardArguments  # noqa: E402
from alignment.config.training import TrainingArguments  # noqa: E402
from alignment.training import setup  # noqa: E402


def train_process_reward_model(model_args, data_args, reward_args, lora_args, train_args, run) -> dict:
    """process_reward: a PRM (alignment/rm/process.py) on step-labelled rows; held-out step accuracy."""
    from alignment.parallel.distributed import is_main_process
    from alignment.rewards.process import save_settings, step_tokens
    from alignment.rm.process import ProcessRewardTrainer, StepDataset, collate_steps

    with setup.started(train_args, run):
        tokenizer, train_raw, eval_raw = setup.load_inputs(model_args.tokenizer_path, data_args, train_args.seed, run)
        tokens = step_tokens(tokenizer, reward_args.placeholder_token, reward_args.reward_tokens)
        train_set = StepDataset(train_raw, tokenizer, tokens, data_args.max_length)
        eval_set = StepDataset(eval_raw, tokenizer, tokens, data_args.max_length) if eval_raw is not None else None
        print(f"solutions: {len(train_set)} train {train_set.stats}"
              + (f", {len(eval_set)} eval {eval_set.stats}" if eval_set is not None else ""))
        model = setup.load_trained_model("causal", model_args.model_name_or_path, run.layout, lora_args,
                                         recompute=train_args.recompute)
        trainer = ProcessRewardTrainer(tokens, train_args, model, tokenizer, train_set, eval_set,
                                       lambda items: collate_steps(items, tokenizer.pad_token_id), run.effective)
    with setup.training_stops(trainer):
        results = trainer.train()
    if setup.benchmark_ended(train_args, "reward model"):
        return results
    before, results = results.get("start", {}), results.get("end", {})
    final = os.path.join(train_args.output_dir, "model")
    if is_main_process():  # rank 0 wrote the model
        save_settings(final, reward_args.placeholder_token, reward_args.reward_tokens)
    print("\nprocess reward model done")
    if "eval/step_accuracy" in results and before:
        print(f"  held-out step accuracy: {before['eval/step_accuracy']:.3f} before -> "
              f"{results['eval/step_accuracy']:.3f} after")
    print(f"  use it in PPO / GRPO: \"reward_model_name_or_path\": \"{final}\" (responses scored step by step at "
          "line breaks; the end reward is the lowest step's p(good))")
    setup.end_processes(train_args)
    return {**results, **{f"start_{k}": v for k, v in before.items()}}


def main(argv=None) -> dict:
    model_args, data_args, reward_args, lora_args, train_args, run = setup.parse_arguments(
        argv, ModelArguments, DataArguments, RewardArguments, LoRAArguments, TrainingArguments)

    from alignment.data.tokenized import collate_preference, preference_datasets
    from alignment.rm.trainer import RewardTrainer

    if reward_args.process_reward:
        return train_process_reward_model(model_args, data_args, reward_args, lora_args, train_args, run)
    with setup.started(train_args, run):
        tokenizer, train_raw, eval_raw = setup.load_inputs(model_args.tokenizer_path, data_args, train_args.seed, run)
        train_set, eval_set = preference_datasets(train_raw, eval_raw, tokenizer, data_args.max_length)
        print(setup.datasets_line("pairs", train_set, eval_set))
        model = setup.load_trained_model(
            "score", model_args.model_name_or_path, run.layout, lora_args, trainable=("score.",),
            recompute=train_args.recompute, score_type="reward",
            do_normalize=reward_args.normalize_score_during_training, normalizer_type=reward_args.normalizer_type,
            normalizer_momentum=reward_args.normalizer_momentum)
        if run.layout.pipeline == 1:
            print("score head: " + ("initialised (started from a causal LM)" if model.head_initialised
                                    else "restored"))
        trainer = RewardTrainer(reward_args, train_args, model, tokenizer, train_set, eval_set,
                                lambda items: collate_preference(items, tokenizer.pad_token_id), run.effective)
    with setup.training_stops(trainer):
        results = trainer.train()
    if setup.benchmark_ended(train_args, "reward model"):
        return results
    before, results = results.get("start", {}), results.get("end", {})
    final = os.path.join(train_args.output_dir, "model")
    print("\nreward model done")
    if "eval/accuracy" in results and before:
        print(f"  held-out pairwise accuracy: {before['eval/accuracy']:.3f} before -> {results['eval/accuracy']:.3f} "
              f"after; chosen score {results['eval/chosen_score']:.3f}, rejected {results['eval/rejected_score']:.3f}")
    if lora_args.lora:
        print(f"  adapter: {final} (PEFT layout + score_normalizer.json); merge it for PPO with: "
              f"python tools/merge_lora.py --is_rm --adapter {final} --output {final}-merged")
        final += "-merged"
    else:
        print(f"  checkpoint: {final} (HF LlamaForSequenceClassification layout + score_normalizer.json)")
    print(f"  use it in PPO: \"reward_model_name_or_path\": \"{final}\" in ppo_argument.json")
    setup.end_processes(train_args)  # prints the wall time; a multi-process run exits here
    return {**results, **{f"start_{k}": v for k, v in before.items()}}


if __name__ == "__main__":
    from alignment.exits import run_program

    sys.exit(run_program(main))
