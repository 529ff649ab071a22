"""The PPO-family trainer's held-out evaluation: greedy responses (or greedy episodes) to the eval prompts, their
reward, gold reward and length, every generation written to eval_generations.jsonl; then the evaluation tasks of
`eval_tasks` (alignment/evaluation), logged as eval/<task>/<metric>."""
from __future__ import annotations

from typing import Dict

import numpy as np
import paddle
from tqdm import tqdm

from alignment.parallel.distributed import gather_lists, is_main_process
from alignment.ppo.rollout import scoring
from alignment.rewards.functions import gold_scores
from alignment.training.batches import eval_shards
from alignment.training.logger import hide_progress


class HeldOutEvaluation:
    """The trainer's evaluation, built once: data (inputs.PromptData: eval_prompts, eval_tasks), the policy sampler
    (samplers.PolicySampler) for the greedy answers, the reward (a RewardComputer) with env_reward_weight x the
    environment's reward, the gold judge (or None), and where results go (the MetricsLogger, output_dir)."""

    def __init__(self, data, sampler, reward, env_reward_weight: float, gold_judge, logger, args):
        self.data, self.sampler, self.reward, self.env_reward_weight = data, sampler, reward, env_reward_weight
        self.gold_judge, self.logger, self.args = gold_judge, logger, args

    def __call__(self, step: int) -> Dict[str, float]:
        """The eval prompts' metrics (when eval_datasets are given) and the evaluation tasks' (when eval_tasks are)
        of the policy at `step`."""
        results = self.prompts(step) if self.data.eval_prompts is not None else {}
        tasks = self.data.eval_tasks(self.sampler.actor, self.sampler.tokenizer, step, self.args.output_dir
                                     if is_main_process() else None) if self.data.eval_tasks else {}
        if tasks:
            self.logger.log(step, tasks, echo=tqdm.write)
        return {**results, **tasks}

    @paddle.no_grad()
    def prompts(self, step: int) -> Dict[str, float]:
        """eval/reward, eval/response_length, eval/gold_reward (with a gold judge) and eval/env/* (episodes)."""
        rewards, golds, lengths, records = [], [], [], []
        prompts, args = self.data.eval_prompts, self.args
        shards = list(eval_shards(len(prompts), args.per_device_eval_batch_size))
        for indices in tqdm(shards, desc="evaluate (greedy answers)", leave=False, dynamic_ncols=True,
                            disable=hide_progress(args)):
            rollout = self.sampler.sample([prompts[i] for i in indices], step, greedy=True)
            reward, _ = scoring.with_environment_reward(*self.reward(rollout), rollout, self.env_reward_weight)
            gold = gold_scores(self.gold_judge, rollout.prompts, rollout.completions, rollout.labels)
            rewards += reward.numpy().tolist()
            golds += [] if gold is None else gold.tolist()
            lengths += rollout.response_mask.sum(axis=1).numpy().tolist()
            records += scoring.generation_records(step, rollout, reward.numpy().tolist())
        rewards, golds, lengths, records = (gather_lists(x) for x in (rewards, golds, lengths, records))
        results = {"eval/reward": float(np.mean(rewards)), "eval/response_length": float(np.mean(lengths)),
                   **scoring.episode_means(records, "eval/env/")}
        if golds:
            results["eval/gold_reward"] = float(np.mean(golds))
            for record, gold in zip(records, golds):
                record["gold_reward"] = gold
        self.logger.log(step, results, echo=tqdm.write)
        self.logger.write_rows("eval_generations.jsonl", records)
        return results
