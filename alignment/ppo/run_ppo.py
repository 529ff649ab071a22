"""Stage 3, policy optimisation: PPO with a critic, or critic-free GRPO / REINFORCE++ / RLOO.

    python alignment/ppo/run_ppo.py config/tiny/ppo_argument.json [--key value ...]
"""
from __future__ import annotations

import os
import sys

if not __package__:  # run as a script from a checkout: make `alignment` importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from alignment.cpu_env import apply_cpu_defaults  # noqa: E402

apply_cpu_defaults()  # this CPU's thread and MKL settings, before paddle is imported

import alignment.ppo.builtins  # noqa: E402,F401  registers what the arguments name, before they are parsed
from alignment.config.data import LoRAArguments  # noqa: E402
from alignment.config.ppo import PPOArguments, PPODataArguments, PPOModelArguments  # noqa: E402
from alignment.config.training import TrainingArguments  # noqa: E402
from alignment.training.setup import (  # noqa: E402
    end_processes, fail, load_raw, parse_arguments, start_processes, training_stops, user_errors)


def build_models(model_args, ppo_args, lora_args, train_args, pipeline_stages: int = 1):
    """(actor, reference, critic or None, reward model or None, reward tokenizer or None). With LoRA on the actor
    the reference is the actor itself (its base weights, adapters off): no second copy of the model. With
    pipeline stages, actor and critic are pipeline models (alignment/wrappers/pipeline.py); the frozen
    reference and reward models stay whole (or tensor-parallel)."""
    from alignment.models import LlamaForCausalLM, Tokenizer
    from alignment.models.lora import add_lora, with_lora
    from alignment.models.score_model import ScoreModel

    if pipeline_stages > 1:
        return build_pipeline_models(model_args, ppo_args, lora_args, train_args, pipeline_stages)
    actor = with_lora(LlamaForCausalLM.from_pretrained(model_args.actor_model_name_or_path,
                                                       recompute=train_args.recompute), lora_args)
    if lora_args.lora:
        reference = actor
    else:
        reference = LlamaForCausalLM.from_pretrained(model_args.actor_model_name_or_path)
        for param in reference.parameters():
            param.stop_gradient = True
    reward_model = reward_tokenizer = None
    if model_args.reward_model_name_or_path:
        reward_model = ScoreModel.from_pretrained(model_args.reward_model_name_or_path)
        for param in reward_model.parameters():
            param.stop_gradient = True
        reward_tokenizer = Tokenizer.from_pretrained(model_args.reward_model_name_or_path)
    critic = None
    if ppo_args.uses_critic:
        path = (model_args.reward_critic_model_name_or_path or model_args.reward_model_name_or_path
                or model_args.actor_model_name_or_path)
        critic = ScoreModel.from_pretrained(path, score_type="critic", do_normalize=False,
                                            recompute=ppo_args.critic_recompute)
        if ppo_args.critic_lora:
            add_lora(critic, lora_args, trainable=("score.",), adapter_path=ppo_args.critic_lora_path)
    return actor, reference, critic, reward_model, reward_tokenizer


def build_pipeline_models(model_args, ppo_args, lora_args, train_args, stages: int):
    from alignment.models import LlamaConfig, LlamaForCausalLM, Tokenizer
    from alignment.models.score_model import ScoreConfig, ScoreModel
    from alignment.ppo.pipeline_update import PolicyPipeLoss, ValuePipeLoss
    from alignment.wrappers.pipeline import load_pipeline_model

    if lora_args.lora or ppo_args.critic_lora:
        raise ValueError("LoRA with pipeline_parallel_degree > 1 is not supported: set 'lora' / 'critic_lora' false")
    path = model_args.actor_model_name_or_path
    actor = load_pipeline_model(LlamaConfig, path, "causal", stages, PolicyPipeLoss(ppo_args),
                                recompute=train_args.recompute)
    reference = LlamaForCausalLM.from_pretrained(path)
    for param in reference.parameters():
        param.stop_gradient = True
    reward_model = reward_tokenizer = critic = None
    if model_args.reward_model_name_or_path:
        reward_model = ScoreModel.from_pretrained(model_args.reward_model_name_or_path)
        for param in reward_model.parameters():
            param.stop_gradient = True
        reward_tokenizer = Tokenizer.from_pretrained(model_args.reward_model_name_or_path)
    if ppo_args.uses_critic:
        critic_path = (model_args.reward_critic_model_name_or_path or model_args.reward_model_name_or_path
                       or path)
        critic = load_pipeline_model(ScoreConfig, critic_path, "score", stages, ValuePipeLoss(ppo_args),
                                     score_type="critic", do_normalize=False, recompute=ppo_args.critic_recompute)
    return actor, reference, critic, reward_model, reward_tokenizer


def main(argv=None) -> dict:
    model_args, data_args, ppo_args, lora_args, train_args, effective = parse_arguments(
        argv, PPOModelArguments, PPODataArguments, PPOArguments, LoRAArguments, TrainingArguments)

    from alignment.data import MixedRawDataset
    from alignment.data.tokenized import PromptOnlyDataset, SupervisedDataset, collate_prompts, collate_supervised
    from alignment.models import Tokenizer
    from alignment.ppo.trainer import PolicyModels, PPOTrainer, PromptData
    from alignment.rewards.functions import RewardFunctionError, load_reward_function
    from alignment.rewards.remote import RewardServerError
    from alignment.rewards.remote import RewardServerClient
    from alignment.rewards.scoring import RewardComputer
    from alignment.training.batches import set_seed

    layout = start_processes(train_args)
    set_seed(train_args.seed)
    with user_errors():
        for spec in ppo_args.reward_funcs + ([ppo_args.gold_judge] if ppo_args.gold_judge else []):
            load_reward_function(spec)  # a typo fails here, before any model is loaded
        tokenizer = Tokenizer.from_pretrained(model_args.actor_model_name_or_path)
        train_raw, eval_raw = load_raw(data_args, train_args.seed)
        prompts = PromptOnlyDataset(train_raw, tokenizer, data_args.max_length, too_long="error")
        eval_prompts = PromptOnlyDataset(eval_raw, tokenizer, data_args.max_length, too_long="error") \
            if eval_raw is not None else None
        ptx = None
        if data_args.ptx_datasets:
            ptx = SupervisedDataset(MixedRawDataset(data_args.ptx_datasets, seed=train_args.seed), tokenizer,
                                    data_args.max_length)
        print(f"prompts: {len(prompts)} train {prompts.stats}" +
              (f", {len(eval_prompts)} eval" if eval_prompts is not None else "") +
              (f"; ptx: {len(ptx)} samples" if ptx is not None else ""))
        # with use_rm_server the server scores (checked to answer first) and no reward model is loaded here
        server = RewardServerClient.from_args(ppo_args, tokenizer) if ppo_args.use_rm_server else None
        actor, reference, critic, reward_model, reward_tokenizer = build_models(
            model_args.for_reward_server() if server else model_args, ppo_args, lora_args, train_args, layout.pipeline)
        reward = RewardComputer(reward_model, reward_tokenizer, tokenizer, ppo_args.reward_funcs,
                                ppo_args.reward_weights, ppo_args.clip_range_score, server)
    scorer = ["reward model"] if reward_model else [f"reward server {', '.join(server.urls)}"] if server else []
    print(f"{ppo_args.advantage_estimator}: critic {'built' if critic is not None else 'not built (critic-free)'}; "
          f"reward = {' + '.join(scorer + list(ppo_args.reward_funcs))}"
          + (" (re-tokenized for the reward model)" if reward.retokenize else ""))
    with user_errors():
        data = PromptData(prompts, eval_prompts, lambda items: collate_prompts(items, tokenizer.pad_token_id), ptx,
                          lambda items: collate_supervised(items, tokenizer.pad_token_id))
        trainer = PPOTrainer(ppo_args, train_args, data_args, PolicyModels(actor, reference, critic, reward), data,
                             tokenizer, effective)
    try:
        with training_stops():
            results = trainer.train()
    except RewardServerError as err:  # unreachable past the retry budget: a run that failed mid-way
        fail(err, code=1)
    except RewardFunctionError as err:
        fail(err)
    print(f"\n{ppo_args.advantage_estimator} done: {trainer.global_step} steps; policy saved to "
          f"{os.path.join(train_args.output_dir, 'policy')}")
    if "start" in results and "end" in results:
        for key in results["end"]:
            print(f"  {key}: {results['start'][key]:.4f} before -> {results['end'][key]:.4f} after")
    end_processes(train_args)  # prints the wall time; a multi-process run exits here
    return results


if __name__ == "__main__":
    main()
