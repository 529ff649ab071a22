"""The PPO-family trainer's held-out evaluation: greedy responses (or greedy episodes) to the eval prompts, their
reward, gold reward and length, every generation written to eval_generations.jsonl; then the evaluation tasks of
`eval_tasks` (alignment/evaluation), logged as eval/<task>/<metric>."""
from __future__ import annotations

from typing import Dict

import numpy as np
import paddle
from tqdm import tqdm

from alignment.parallel.distributed import gather_lists, is_main_process
from alignment.ppo import scoring
from alignment.rewards.functions import gold_scores
from alignment.training.batches import eval_shards
from alignment.training.logger import hide_progress


def evaluate_policy(trainer) -> Dict[str, float]:
    """The eval prompts' metrics (when eval_datasets are given) and the evaluation tasks' (when eval_tasks are)."""
    results = evaluate_prompts(trainer) if trainer.data.eval_prompts is not None else {}
    tasks = trainer.data.eval_tasks(trainer.actor, trainer.tokenizer, trainer.global_step, trainer.args.output_dir
                                    if is_main_process() else None) if trainer.data.eval_tasks else {}
    if tasks:
        trainer.logger.log(trainer.global_step, tasks, echo=tqdm.write)
    return {**results, **tasks}


@paddle.no_grad()
def evaluate_prompts(trainer) -> Dict[str, float]:
    """eval/reward, eval/response_length, eval/gold_reward (with a gold judge) and eval/env/* (episodes)."""
    rewards, golds, lengths, records = [], [], [], []
    prompts = trainer.data.eval_prompts
    shards = list(eval_shards(len(prompts), trainer.args.per_device_eval_batch_size))
    for indices in tqdm(shards, desc="evaluate (greedy answers)", leave=False, dynamic_ncols=True,
                        disable=hide_progress(trainer.args)):
        rollout = trainer.make_rollout([prompts[i] for i in indices], greedy=True)
        reward, _ = scoring.with_environment_reward(*trainer.reward(rollout), rollout, trainer.env_reward_weight)
        gold = gold_scores(trainer.ppo.gold_judge, rollout.prompts, rollout.completions, rollout.labels)
        rewards += reward.numpy().tolist()
        golds += [] if gold is None else gold.tolist()
        lengths += rollout.response_mask.sum(axis=1).numpy().tolist()
        records += scoring.generation_records(trainer.global_step, rollout, reward.numpy().tolist())
    rewards, golds, lengths, records = (gather_lists(x) for x in (rewards, golds, lengths, records))
    results = {"eval/reward": float(np.mean(rewards)), "eval/response_length": float(np.mean(lengths)),
               **scoring.episode_means(records, "eval/env/")}
    if golds:
        results["eval/gold_reward"] = float(np.mean(golds))
        for record, gold in zip(records, golds):
            record["gold_reward"] = gold
    trainer.logger.log(trainer.global_step, results, echo=tqdm.write)
    trainer.logger.write_rows("eval_generations.jsonl", records)
    return results
