"""The PPO-family loop, top to bottom: rollout -> score -> advantages -> update. The math is in algorithms.py.

advantage_estimator "gae" trains actor and critic (PPO); the critic-free estimators (grpo, dr_grpo, rloo,
reinforce_baseline, reinforce_plus_plus) build no critic at all.
"""
from __future__ import annotations

import dataclasses
import math
import os
import time
from typing import Dict, List

import numpy as np
import paddle
from paddle.distributed import fleet
from tqdm import tqdm

from alignment.models import LlamaForCausalLM
from alignment.models.generation import GenerationConfig
from alignment.models.score_model import ScoreModel
from alignment.models.lora import adapters_disabled
from alignment.models.normalizer import RunningMeanStd
from alignment.models.static_decode import StaticDecoder
from alignment.parallel.offload import Offloader, parse_levels
from alignment.parallel.pipeline import PipelineModel, check_pipeline_run, pipeline_step
from alignment.parallel.reshard import WholeCopy
from alignment.ppo import algorithms as rl
from alignment.ppo.rewards import gold_scores
from alignment.ppo.rollout import critic_values, response_log_probs, sample_rollout, update_order
from alignment.sft.trainer import answer_token_loss
from alignment.training.distributed import (average_gradients, barrier, data_world_size, gather_lists,
                                            init_distributed, is_main_process, layout_name, mean_over_ranks,
                                            shard, sum_over_data_ranks)
from alignment.training.checkpointing import load_checkpoint, resolve_resume, save_checkpoint, skip_batches
from alignment.training.logger import MetricsLogger
from alignment.training.optim import build_optimizer, clip_gradients, global_grad_norm
from alignment.training.trainer import NonFiniteGuard, epoch_batches, eval_shards, to_tensors


class PPOTrainer:
    def __init__(self, ppo_args, train_args, data_args, actor, reference, critic, reward, tokenizer, prompts,
                 eval_prompts, ptx_data, collate_prompts, collate_ptx, effective_args=None):
        self.ppo, self.args, self.data_args = ppo_args, train_args, data_args
        self.actor, self.reference, self.critic, self.reward, self.tokenizer = actor, reference, critic, reward, tokenizer
        self.prompts, self.eval_prompts, self.ptx_data = prompts, eval_prompts, ptx_data
        self.collate_prompts, self.collate_ptx = collate_prompts, collate_ptx
        init_distributed()
        self.logger = MetricsLogger(train_args.output_dir, enabled=is_main_process(),
                                    first_files={"args.json": effective_args} if effective_args else None)
        steps_per_epoch = math.ceil(len(prompts) / (ppo_args.per_device_prompt_batch_size * data_world_size()))
        self.total_steps = train_args.max_steps if train_args.max_steps > 0 else \
            max(1, int(steps_per_epoch * train_args.num_train_epochs))
        rollouts = ppo_args.per_device_prompt_batch_size * ppo_args.num_return_sequences
        micro_batches = math.ceil(rollouts / train_args.per_device_train_batch_size)
        optimizer_steps = self.total_steps * ppo_args.update_iters * max(
            1, micro_batches // train_args.gradient_accumulation_steps)
        self.actor_opt, self.actor_sched = build_optimizer(actor, train_args, optimizer_steps)
        # one pass and one optimizer step over a rollout whose advantages do not use the old log-probs: the policy
        # that sampled it is the one being updated, so old log-probs = the update's own (detached); score() skips
        # that forward pass (as TRL's GRPO does with num_iterations 1)
        self.pipelined = isinstance(actor, PipelineModel)
        self.reuse_update_log_probs = (ppo_args.advantage_estimator in rl.GROUP_ESTIMATORS
                                       and ppo_args.update_iters == 1 and not self.pipelined
                                       and micro_batches <= train_args.gradient_accumulation_steps)
        self.critic_opt = self.critic_sched = None
        if critic is not None:
            critic_args = dataclasses.replace(
                train_args, learning_rate=ppo_args.critic_learning_rate, min_learning_rate=0.0,
                weight_decay=ppo_args.critic_weight_decay, lr_scheduler_type=ppo_args.critic_lr_scheduler_type,
                warmup_ratio=ppo_args.critic_warmup_ratio, warmup_steps=0)
            self.critic_opt, self.critic_sched = build_optimizer(critic, critic_args, optimizer_steps)
        self.offload = Offloader(parse_levels(ppo_args.offload_level), [reference, reward.model], [actor, critic],
                                 [self.actor_opt, self.critic_opt])
        self.offload.offload_all()
        split = actor.config.tensor_parallel_degree > 1
        self.generation_copy = WholeCopy(actor, LlamaForCausalLM) if self.pipelined or (
            split and ppo_args.eval_mode == "single") else None
        self.critic_copy = None
        self.static_decoders = {}  # rollout_decode static: compiled decode steps per generating model
        if self.pipelined:
            check_pipeline_run(ppo_args, train_args, rollouts, ptx_data)
            self.actor_pipe = fleet.distributed_model(actor)
            self.critic_pipe = fleet.distributed_model(critic) if critic is not None else None
            self.critic_copy = WholeCopy(critic, ScoreModel) if critic is not None else None
        self.reward_stats = RunningMeanStd()
        self.gen_config = GenerationConfig(  # max_new_tokens is set per batch from max_length
            max_new_tokens=1, do_sample=True, temperature=ppo_args.temperature, top_p=ppo_args.top_p,
            top_k=ppo_args.top_k, repetition_penalty=ppo_args.repetition_penalty,
            eos_token_id=actor.config.eos_token_ids or tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
        self.global_step = 0
        self.drawn = {"prompts": 0, "ptx": 0}  # batches taken from each data stream (resume skips them)
        self.guard = NonFiniteGuard(train_args.max_nonfinite_steps, train_args.output_dir)
        self.resume_path = resolve_resume(train_args.output_dir, train_args.resume_from_checkpoint)
        if self.resume_path is not None:
            state = load_checkpoint(self.resume_path, *self._checkpointed(), layout=layout_name())
            self.global_step, self.drawn = state["global_step"], state["drawn"]
            self.reward_stats.load_state_dict(state["reward_stats"])
            self.guard.load_state_dict(state["nonfinite"])
            self.logger.resume_at(self.global_step)
            print(f"resumed from {self.resume_path} at step {self.global_step}")

    # --- one PPO step: rollout -> score -> advantages -> update ---------------------------------------------------
    def train(self) -> Dict[str, float]:
        world = data_world_size()
        prompt_batches = epoch_batches(len(self.prompts), self.ppo.per_device_prompt_batch_size * world,
                                       self.args.seed, min_size=world)
        ptx_batches = epoch_batches(len(self.ptx_data), self.args.per_device_train_batch_size * world,
                                    self.args.seed + 1, min_size=world) if self.ptx_data is not None else None
        skip_batches(prompt_batches, self.drawn["prompts"])
        if ptx_batches is not None:
            skip_batches(ptx_batches, self.drawn["ptx"])
        progress = tqdm(total=self.total_steps, initial=self.global_step, desc="ppo", dynamic_ncols=True,
                        disable=self.args.disable_tqdm or not is_main_process())
        fresh = self.global_step == 0
        results = {"start": self.evaluate()} if self.eval_prompts is not None and self.args.do_eval and fresh else {}
        while self.global_step < self.total_steps:
            times = {}
            start = time.perf_counter()
            self.drawn["prompts"] += 1
            # sampling noise is seeded per step and drawn per row of the global batch: the same rollout whether
            # one process or several (any data / tensor-parallel split) generate it, and after a resume
            paddle.seed(self.args.seed + 1_000_003 * (self.global_step + 1))
            batch = next(prompt_batches)
            positions = shard(list(range(len(batch))))
            with self.offload.phase("generate", [self.actor]):
                rollout = self.make_rollout([self.prompts[int(batch[p])] for p in positions], positions=positions,
                                            total=len(batch))
            times["time/generate"] = time.perf_counter() - start
            start = time.perf_counter()
            with self.offload.phase("score", [self.actor, self.reference, self.critic, self.reward.model]):
                metrics = self.score(rollout)
            metrics.update(self.compute_advantages(rollout))
            times["time/score"] = time.perf_counter() - start
            start = time.perf_counter()
            with self.offload.phase("train", [self.actor, self.critic], [self.actor_opt,
                                                                         self.critic_opt]):
                metrics.update(self.update(rollout, ptx_batches))
            metrics.update(self.offload.memory_log)  # GPU: allocated memory around each phase
            metrics["skipped_steps"] = float(self.guard.skipped)  # optimizer steps dropped for NaN/inf gradients
            times["time/train"] = time.perf_counter() - start
            metrics = mean_over_ranks({**metrics, **times})
            self.global_step += 1
            progress.update(1)
            if self.global_step % self.args.logging_steps == 0 or self.global_step == self.total_steps:
                self.logger.log(self.global_step, metrics, echo=progress.write)
            progress.set_postfix(reward=f"{metrics['reward/mean']:.3f}", kl=f"{metrics['kl']:.3f}")
            if self._due(self.args.eval_steps) and self.global_step < self.total_steps:
                self.evaluate()
            if self._due(self.args.save_steps) and self.global_step < self.total_steps:
                self.save_step_checkpoint()
        progress.close()
        if self.eval_prompts is not None and self.args.do_eval:
            results["end"] = self.evaluate()
        self.save(self.args.output_dir)
        self.logger.close()
        return results

    def _due(self, every: int) -> bool:
        return every > 0 and self.global_step % every == 0

    def make_rollout(self, items, greedy: bool = False, positions=None, total=None):
        """Responses to the prompt items (num_return_sequences each when sampling, one each when greedy);
        positions / total: the items' places in the step's global batch (see sample_rollout)."""
        budget = self.data_args.max_length - max(len(item["input_ids"]) for item in items)
        config = dataclasses.replace(self.gen_config, max_new_tokens=min(budget, self.ppo.max_new_tokens or budget))
        if greedy:
            config = dataclasses.replace(config, do_sample=False, repetition_penalty=1.0)
        samples = 1 if greedy else self.ppo.num_return_sequences
        actor = self.rollout_actor()
        static = None
        if self.ppo.rollout_decode == "static":  # one decoder per model object (the actor, or its whole copy)
            if id(actor) not in self.static_decoders:
                self.static_decoders[id(actor)] = StaticDecoder(actor)
            static = self.static_decoders[id(actor)]
        return sample_rollout(actor, self.tokenizer, items, config, samples, self.collate_prompts, positions, total,
                              static)

    def rollout_actor(self):
        """The actor that generates and scores: the trained one, or its whole copy (eval_mode single, pipeline)."""
        if self.generation_copy is None:
            return self.actor
        return self.generation_copy.refreshed(self.actor, version=self.global_step)

    @paddle.no_grad()
    def score(self, rollout) -> Dict[str, float]:
        """Old and reference log-probs, old values and end rewards of the rollout (in place)."""
        ids, mask, p = rollout.input_ids, rollout.attention_mask, rollout.prompt_len
        self.actor.eval()
        if not self.reuse_update_log_probs:
            rollout.old_log_probs, _ = response_log_probs(self.rollout_actor(), ids, mask, p, self.ppo.temperature)
        with adapters_disabled(self.reference):  # with LoRA the reference is the actor's base: adapters off
            rollout.ref_log_probs, _ = response_log_probs(self.reference, ids, mask, p, self.ppo.temperature)
        if self.critic is not None:
            critic = self.critic if self.critic_copy is None else \
                self.critic_copy.refreshed(self.critic, version=self.global_step)
            critic.eval()
            rollout.old_values = critic_values(critic, ids, mask, p)
        end_rewards, parts = self.reward(rollout)
        every = paddle.to_tensor(gather_lists(end_rewards.numpy().tolist()), dtype="float32")  # the global batch's
        metrics = {"reward/mean": float(every.mean()), "reward/std": float(every.std(unbiased=False)), **parts}
        if self.ppo.normalize_reward:  # statistics of the whole batch, identical on every rank
            self.reward_stats.update(every)
            end_rewards = self.reward_stats.normalize(end_rewards)
        rollout.end_rewards = end_rewards
        gold = gold_scores(self.ppo.gold_judge, rollout.prompts, rollout.completions, rollout.labels)
        if gold is not None:
            metrics["gold_reward/mean"] = float(gold.mean())
        lengths = rollout.response_mask.sum(axis=1)  # [N]
        eos = set(self.gen_config.eos_ids)  # the ids generation stops on, not only the tokenizer's eos
        ended = [not eos.isdisjoint(row) for row in rollout.input_ids[:, p:].numpy().tolist()]
        metrics.update({"response_length": float(lengths.mean()), "truncated": 1.0 - float(np.mean(ended))})
        return metrics

    @paddle.no_grad()
    def compute_advantages(self, rollout) -> Dict[str, float]:
        mask, ppo = rollout.response_mask, self.ppo
        kl_in_reward = 0.0 if ppo.kl_in_loss else ppo.kl_coeff
        if ppo.advantage_estimator == "gae":
            rewards, _ = rl.reward_with_kl(rollout.end_rewards, rollout.old_log_probs, rollout.ref_log_probs, mask,
                                           kl_in_reward, math.inf, ppo.kl_estimator)  # [N, R]
            advantages, rollout.returns = rl.compute_gae(rollout.old_values, rewards, mask, ppo.gamma, ppo.gae_lambda)
            if ppo.normalize_advantage:
                advantages = rl.masked_whiten(advantages, mask, reduce_sum=sum_over_data_ranks)
        elif ppo.advantage_estimator == "reinforce_plus_plus":
            advantages = rl.reinforce_plus_plus_advantages(rollout.end_rewards, rollout.old_log_probs,
                                                           rollout.ref_log_probs, mask, kl_in_reward, ppo.gamma,
                                                           ppo.kl_estimator, sum_over_data_ranks)
        else:
            per_sequence = rl.group_advantages(rollout.end_rewards, ppo.num_return_sequences, ppo.advantage_estimator)
            advantages = rl.broadcast_sequence_advantages(per_sequence, mask)  # [N, R]
        rollout.advantages = advantages
        out = {"advantage/mean": float(rl.masked_mean(advantages, mask))}
        if rollout.old_log_probs is not None:  # else actor_step reports it (reuse_update_log_probs)
            out["kl"] = sequence_kl(rollout.old_log_probs, rollout.ref_log_probs, mask, ppo.kl_estimator)
        return out

    def update(self, rollout, ptx_batches) -> Dict[str, float]:
        """`update_iters` passes over the rollout in micro-batches: actor step, then critic step."""
        args, ppo = self.args, self.ppo
        self.actor.train()
        if self.critic is not None:
            self.critic.train()
        rows: List[Dict[str, float]] = []
        rng = np.random.default_rng(args.seed + 7919 * self.global_step)
        if self.pipelined:
            return self.pipeline_update(rollout, rng)
        size, accum, micro = args.per_device_train_batch_size, args.gradient_accumulation_steps, 0
        lengths = rollout.attention_mask.sum(axis=1).numpy()  # prompt + response tokens of each row
        for _ in range(ppo.update_iters):
            order = update_order(rng, lengths, size, ppo.group_by_length)
            for start in range(0, len(rollout), size):
                batch = rollout.select(paddle.to_tensor(order[start: start + size])).packed()
                stats = self.actor_step(batch, ptx_batches, accum)
                if self.critic is not None:
                    stats.update(self.critic_step(batch, accum))
                micro += 1
                if micro % accum == 0:
                    self._optimizer_step()
                rows.append(stats)
        if micro % accum:
            self._optimizer_step()
        return {k: float(np.mean([r[k] for r in rows])) for k in rows[0]}

    def pipeline_update(self, rollout, rng) -> Dict[str, float]:
        """update() under pipeline parallelism: the same micro-batches (per_device_train_batch_size rows), run
        gradient_accumulation_steps at a time through 1F1B with the losses on the last stage."""
        size, accum, ranks = self.args.per_device_train_batch_size, self.args.gradient_accumulation_steps, \
            data_world_size()
        rows, lengths = [], rollout.attention_mask.sum(axis=1).numpy()
        for _ in range(self.ppo.update_iters):
            order = update_order(rng, lengths, size, self.ppo.group_by_length)  # the micro-batches update() forms
            for start in range(0, len(rollout), size * accum):
                batch = rollout.select(paddle.to_tensor(order[start: start + size * accum])).trimmed()
                tokens = batch.response_mask.reshape([accum, -1]).sum(axis=1)  # [accum] per micro-batch
                weight = (ranks / paddle.clip(sum_over_data_ranks(tokens), min=1.0)).repeat_interleave(size)
                weight = weight.unsqueeze(-1)  # [n, 1]: fleet slices every label along a second axis
                inputs = (batch.input_ids, batch.attention_mask)
                stats = pipeline_step(self.actor_pipe, inputs, (
                    batch.input_ids[:, batch.prompt_len:], batch.old_log_probs, batch.advantages,
                    batch.response_mask, batch.ref_log_probs, weight), self.actor._loss_fn[0], accum)
                stats["lr"] = self.actor_opt.get_lr()
                if self.critic is not None:
                    stats.update(pipeline_step(self.critic_pipe, inputs, (
                        batch.old_values, batch.returns, batch.response_mask, weight), self.critic._loss_fn[0], accum))
                self._optimizer_step()
                rows.append(stats)
        return {k: float(np.mean([r[k] for r in rows])) for k in rows[0]}

    def _optimizer_step(self):
        pairs = [(self.actor, self.actor_opt, self.actor_sched)]
        if self.critic is not None:
            pairs.append((self.critic, self.critic_opt, self.critic_sched))
        norms = []
        for model, _, _ in pairs:
            average_gradients(model.parameters())
            norms.append(global_grad_norm(model.parameters()))
        finite = self.guard.check(self.global_step + 1, *norms)  # NaN/inf: skip this update of both models
        for (model, opt, sched), norm in zip(pairs, norms):
            if finite:
                clip_gradients(model.parameters(), self.args.max_grad_norm, norm)
                opt.step()
                sched.step()
            opt.clear_grad()

    def actor_step(self, batch, ptx_batches, accum) -> Dict[str, float]:
        ppo, mask = self.ppo, batch.response_mask
        log_probs, entropy = response_log_probs(self.actor, batch.input_ids, batch.attention_mask, batch.prompt_len,
                                                ppo.temperature, with_entropy=True,
                                                response_index=batch.response_index)
        old_log_probs, out = batch.old_log_probs, {}
        if old_log_probs is None:  # reuse_update_log_probs: this policy sampled the rollout
            old_log_probs = log_probs.detach()
            out["kl"] = sequence_kl(old_log_probs, batch.ref_log_probs, mask, ppo.kl_estimator)
        loss, stats = rl.policy_loss_and_stats(log_probs, old_log_probs, batch.advantages, mask,
                                               ppo.clip_range_ratio)
        if ppo.kl_in_loss:
            kl = rl.masked_mean(rl.kl_penalty(log_probs, batch.ref_log_probs, ppo.kl_estimator), mask)
            loss = loss + ppo.kl_coeff * kl
        share = token_share(mask)  # token means over the whole batch, not per process
        loss = loss * share
        out.update({"actor_loss": float(loss), "entropy": share * float(rl.masked_mean(entropy, mask)),
                    **{k: share * float(v) for k, v in stats.items()}, "lr": self.actor_opt.get_lr()})
        if ptx_batches is not None:
            self.drawn["ptx"] += 1
            ptx = to_tensors(self.collate_ptx([self.ptx_data[int(i)] for i in shard(next(ptx_batches))]))
            ptx_loss, _ = answer_token_loss(self.actor, ptx["input_ids"], ptx["attention_mask"], ptx["labels"])
            loss = loss + ppo.ptx_coeff * ptx_loss
            out["ptx_loss"] = float(ptx_loss)
        (loss / accum).backward()
        return out

    def critic_step(self, batch, accum) -> Dict[str, float]:
        values = critic_values(self.critic, batch.input_ids, batch.attention_mask, batch.prompt_len,
                               batch.response_index)  # [n, R]
        loss = rl.critic_loss(values, batch.old_values, batch.returns, batch.response_mask, self.ppo.clip_range_value)
        loss = loss * token_share(batch.response_mask)
        (loss / accum).backward()
        return {"critic_loss": float(loss), "explained_variance": float(
            rl.explained_variance(values.detach(), batch.returns, batch.response_mask))}

    # --- evaluation and checkpoints -------------------------------------------------------------------------------
    def evaluate(self) -> Dict[str, float]:
        with self.offload.phase("evaluate", [self.actor, self.reward.model]):
            return self._evaluate()

    @paddle.no_grad()
    def _evaluate(self) -> Dict[str, float]:
        """Greedy responses to the eval prompts: reward, gold reward, length; generations go to a JSONL file."""
        rewards, golds, lengths, records = [], [], [], []
        for indices in eval_shards(len(self.eval_prompts), self.args.per_device_eval_batch_size):
            items = [self.eval_prompts[i] for i in indices]
            rollout = self.make_rollout(items, greedy=True)
            reward, _ = self.reward(rollout)
            gold = gold_scores(self.ppo.gold_judge, rollout.prompts, rollout.completions, rollout.labels)
            rewards += reward.numpy().tolist()
            golds += [] if gold is None else gold.tolist()
            lengths += rollout.response_mask.sum(axis=1).numpy().tolist()
            records += [{"step": self.global_step, "prompt": p, "completion": c, "reward": r}
                        for p, c, r in zip(rollout.prompts, rollout.completions, reward.numpy().tolist())]
        rewards, golds, lengths, records = (gather_lists(x) for x in (rewards, golds, lengths, records))
        results = {"eval/reward": float(np.mean(rewards)), "eval/response_length": float(np.mean(lengths))}
        if golds:
            results["eval/gold_reward"] = float(np.mean(golds))
            for record, gold in zip(records, golds):
                record["gold_reward"] = gold
        self.logger.log(self.global_step, results, echo=tqdm.write)
        self.logger.write_rows("eval_generations.jsonl", records)
        return results

    def _checkpointed(self):
        """(models, optimizers) of a resumable checkpoint, by the names they are saved under."""
        models, optimizers = {"policy": self.actor}, {"policy": (self.actor_opt, self.actor_sched)}
        if self.critic is not None:
            models["value"], optimizers["value"] = self.critic, (self.critic_opt, self.critic_sched)
        return models, optimizers

    def save_step_checkpoint(self) -> None:
        with self.offload.phase("checkpoint", [self.actor, self.critic], [self.actor_opt,
                                                                          self.critic_opt]):
            self._save_step_checkpoint()

    def _save_step_checkpoint(self) -> None:
        state = {"drawn": self.drawn, "reward_stats": self.reward_stats.state_dict(),
                 "nonfinite": self.guard.state_dict()}
        save_checkpoint(self.args.output_dir, self.global_step, *self._checkpointed(), state,
                        self.tokenizer.name_or_path, self.args.save_total_limit, layout_name())  # every rank
        barrier()

    def save(self, directory: str) -> None:
        with self.offload.phase("save", [self.actor, self.critic]):
            self._save(directory)

    def _save(self, directory: str) -> None:
        self.actor.save_pretrained(os.path.join(directory, "policy"), tokenizer_dir=self.tokenizer.name_or_path)
        if self.critic is not None:  # every rank calls save_pretrained; rank 0 writes
            self.critic.save_pretrained(os.path.join(directory, "value"), tokenizer_dir=self.tokenizer.name_or_path)
        barrier()


def token_share(mask) -> float:
    """Factor that turns this process's token mean into its share of the whole batch's token mean, once the
    gradients are averaged over data ranks: n_local * ranks / n_all (1 for one process)."""
    ranks = data_world_size()
    if ranks == 1:
        return 1.0
    local = mask.astype("float32").sum()
    return float(local) * ranks / max(float(sum_over_data_ranks(local)), 1.0)


def sequence_kl(log_probs, ref_log_probs, mask, estimator: str) -> float:
    """The logged `kl`: per-token KL estimate summed over each response, averaged over the rows."""
    return float(rl.masked_sum(rl.kl_penalty(log_probs, ref_log_probs, estimator), mask, axis=1).mean())
