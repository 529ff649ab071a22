"""The two reward models stage 2 trains, as strategies of one recipe (alignment/rm/run_reward.py): each builds its
trainer from the loaded inputs and says what it made. `process_reward` picks the kind."""
from __future__ import annotations

from types import SimpleNamespace

from alignment.training import setup


class PairwiseReward:
    """A score model trained on (better, worse) answers: held-out pairwise accuracy."""

    def trainer(self, args: SimpleNamespace, tokenizer, train_raw, eval_raw):
        from alignment.data.tokenized import collate_preference, preference_datasets
        from alignment.rm.reward_trainer import RewardTrainer

        reward, run = args.reward, args.run
        train_set, eval_set = preference_datasets(train_raw, eval_raw, tokenizer, args.data.max_length)
        print(setup.datasets_line("pairs", train_set, eval_set))
        model = setup.load_trained_model(
            "score", args.model.model_name_or_path, run.layout, args.lora, trainable=("score.",),
            recompute=args.train.recompute, score_type="reward", do_normalize=reward.normalize_score_during_training,
            normalizer_type=reward.normalizer_type, normalizer_momentum=reward.normalizer_momentum)
        if run.layout.pipeline == 1:
            print("score head: " + ("initialised (started from a causal LM)" if model.head_initialised
                                    else "restored"))
        return RewardTrainer(reward, args.train, model, tokenizer, train_set, eval_set,
                             lambda items: collate_preference(items, tokenizer.pad_token_id), run.effective)

    def report(self, args: SimpleNamespace, before: dict, results: dict, final: str) -> None:
        print("\nreward model done")
        if "eval/accuracy" in results and before:
            print(f"  held-out pairwise accuracy: {before['eval/accuracy']:.3f} before -> "
                  f"{results['eval/accuracy']:.3f} after; chosen score {results['eval/chosen_score']:.3f}, "
                  f"rejected {results['eval/rejected_score']:.3f}")
        if args.lora.lora:
            print(f"  adapter: {final} (PEFT layout + score_normalizer.json); merge it for PPO with: "
                  f"python tools/merge_lora.py --is_rm --adapter {final} --output {final}-merged")
            final += "-merged"
        else:
            print(f"  checkpoint: {final} (HF LlamaForSequenceClassification layout + score_normalizer.json)")
        print(f"  use it in PPO: \"reward_model_name_or_path\": \"{final}\" in ppo_argument.json")


class ProcessReward:
    """A process reward model (alignment/rm/process.py) on step-labelled rows: held-out step accuracy."""

    def trainer(self, args: SimpleNamespace, tokenizer, train_raw, eval_raw):
        from alignment.rewards.process import step_tokens
        from alignment.rm.process import ProcessRewardTrainer, StepDataset, collate_steps

        reward, max_length = args.reward, args.data.max_length
        self.tokens = step_tokens(tokenizer, reward.placeholder_token, reward.reward_tokens)
        train_set = StepDataset(train_raw, tokenizer, self.tokens, max_length)
        eval_set = StepDataset(eval_raw, tokenizer, self.tokens, max_length) if eval_raw is not None else None
        print(f"solutions: {len(train_set)} train {train_set.stats}"
              + (f", {len(eval_set)} eval {eval_set.stats}" if eval_set is not None else ""))
        model = setup.load_trained_model("causal", args.model.model_name_or_path, args.run.layout, args.lora,
                                         recompute=args.train.recompute)
        return ProcessRewardTrainer(self.tokens, args.train, model, tokenizer, train_set, eval_set,
                                    lambda items: collate_steps(items, tokenizer.pad_token_id), args.run.effective)

    def report(self, args: SimpleNamespace, before: dict, results: dict, final: str) -> None:
        from alignment.parallel.distributed import is_main_process
        from alignment.rewards.process import save_settings

        if is_main_process():  # rank 0 wrote the model
            save_settings(final, args.reward.placeholder_token, args.reward.reward_tokens)
        print("\nprocess reward model done")
        if "eval/step_accuracy" in results and before:
            print(f"  held-out step accuracy: {before['eval/step_accuracy']:.3f} before -> "
                  f"{results['eval/step_accuracy']:.3f} after")
        print(f"  use it in PPO / GRPO: \"reward_model_name_or_path\": \"{final}\" (responses scored step by step "
              "at line breaks; the end reward is the lowest step's p(good))")


def reward_kind(reward_args):
    return ProcessReward() if reward_args.process_reward else PairwiseReward()
