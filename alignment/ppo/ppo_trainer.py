"""The PPO-family step, top to bottom: rollout -> score -> advantages -> update. The math is in algorithms.py.

The advantage estimator (estimators.py) says whether a critic is trained; without one no critic is built at all
(critic.py: the two as strategies). The update loop is update.py's; under pipeline parallelism it runs its
micro-batches through fleet's 1F1B schedule (pipeline_update.py) and whole copies of the models generate and
score. dynamic_sampling: dynamic_sampling.py. The loop, optimizer steps, logging and checkpoints are the
skeleton's (training/trainer.py).
"""
from __future__ import annotations

import dataclasses
import functools
import math
from typing import Dict

import paddle

from alignment.models import LlamaForCausalLM
from alignment.models.lora import adapters_disabled
from alignment.models.normalizer import RunningMeanStd
from alignment.models.score_model import ScoreModel
from alignment.parallel.distributed import (data_world_size, gather_lists, is_main_process, mean_over_ranks,
                                            sum_over_data_ranks)
from alignment.ppo.rl_math import algorithms as rl
from alignment.ppo.checkpoints import PPOCheckpoints
from alignment.ppo.rollout.agent_programs import make_sampler
from alignment.ppo.rl_math import registrations  # noqa: F401  the estimators, losses, KL estimators the arguments name
from alignment.ppo.rl_math import dapo
from alignment.ppo.rollout import fault_policy, scoring
from alignment.ppo.rollout import dynamic_sampling as ds
from alignment.ppo.learner.critic import make_critic
from alignment.ppo.rollout.evaluation import HeldOutEvaluation
from alignment.ppo.inputs import PolicyModels, PromptData  # noqa: F401  (the trainer's inputs)
from alignment.ppo.rl_math.kl import kl_estimate
from alignment.ppo.rollout.ledger import Ledger, ledger_rows, reward_sources
from alignment.ppo.rl_math.objective import actor_objective
from alignment.ppo.learner.pipeline_update import PipelineMicroBatches, check_pipeline_run
from alignment.ppo.rollout.prompt_stream import PromptStream
from alignment.ppo.learner.ptx import ptx_term
from alignment.ppo.learner.routing_replay import routing_for
from alignment.ppo.rollout.samplers import PolicySampler, rollout_generation_config
from alignment.ppo.asynchronous.sources import StepDraws, rollout_source
from alignment.ppo.learner.update import EagerMicroBatches, first_pass_log_probs, run_update, update_rng
from alignment.training.batches import planned_steps
from alignment.training.monitored_run import MonitoredRun
from alignment.training.timing import PhaseTimer
from alignment.training.trainer import Trainer
from alignment.wrappers.offload import Offloader
from alignment.wrappers.pipeline import PipelineModel
from alignment.wrappers.reshard import WholeCopy


class PPOTrainer(PPOCheckpoints, MonitoredRun, Trainer):
    progress_name = "ppo"
    evaluate_at_start = True  # the starting policy's held-out reward

    def __init__(self, ppo_args, train_args, data_args, models: PolicyModels, data: PromptData, tokenizer,
                 effective_args=None, env_args=None, async_args=None, source=None, monitor_args=None):
        super().__init__(train_args, tokenizer, effective_args)
        self.routing = routing_for(ppo_args.moe_routing_replay, models.actor)  # routing_replay.py: MoE policies
        if self.routing.has_experts:  # a shared prompt's pass would route prompts and answers in separate forwards
            ppo_args = dataclasses.replace(ppo_args, shared_prompt_forward=False)
        self.ppo, self.max_length, self.data = ppo_args, data_args.max_length, data
        self.actor, self.reference, self.reward, self.teacher = models.actor, models.reference, models.reward, \
            models.teacher
        self.total_steps = planned_steps(train_args.max_steps, train_args.num_train_epochs, len(data.prompts),
                                         ppo_args.per_device_prompt_batch_size * data_world_size(),
                                         train_args.dataloader_drop_last)
        self.cap = async_args.behaviour_weight_cap if async_args is not None else 0.0
        rollouts = ppo_args.per_device_prompt_batch_size * ppo_args.num_return_sequences
        micro_batches = math.ceil(rollouts / train_args.per_device_train_batch_size)
        optimizer_steps = self.total_steps * ppo_args.update_iters * max(
            1, micro_batches // train_args.gradient_accumulation_steps)
        self.policy = self.add_trained("policy", self.actor, optimizer_steps)
        if models.critic is not None:
            self.add_trained("value", models.critic, optimizer_steps, ppo_args.critic_training(train_args))
        pipelined = isinstance(self.actor, PipelineModel)
        self.estimator = self.teacher.estimator(ppo_args.estimator())  # sampled_kl adds the teacher's term
        # the update's first optimizer step takes the whole rollout, at the weights that sampled and scored it
        one_step = not pipelined and micro_batches <= train_args.gradient_accumulation_steps
        # ... and is its only one, and the advantages do not use the old log-probs: old log-probs = the update's
        # own (detached); score() skips that forward pass (as TRL's GRPO does with num_iterations 1)
        self.reuse_update_log_probs = (not self.estimator.uses_old_log_probs and source is None  # samples here
                                       and one_step and ppo_args.update_iters == 1)
        self.draft_models = models.draft.models if models.draft is not None else ()  # frozen; generate uses them
        self.offload = Offloader(ppo_args.offload_levels, [self.reference, self.reward.model,
                                                           *self.teacher.models("frozen"), *self.draft_models],
                                 [self.actor, models.critic], [t.optimizer for t in self.trained.values()])
        self.offload.offload_all()
        split = self.actor.config.tensor_parallel_degree > 1  # sharding stage 3: decoding reads whole weights
        experts_split = self.actor.config.expert_parallel_degree > 1  # each rank decodes its own lengths
        self.generation_copy = WholeCopy(self.actor, LlamaForCausalLM) if pipelined or experts_split or (
            split and ppo_args.eval_mode == "single") or self.policy.sharding.slices_parameters else None
        ds.check_layout(ppo_args, data_world_size(), pipelined)
        if pipelined:
            check_pipeline_run(ppo_args, train_args, rollouts, data.ptx)
            self.micro_batches = PipelineMicroBatches(self.actor, models.critic, ppo_args, train_args,
                                                      self.precision, self.policy.optimizer.get_lr,
                                                      self.routing.records)
        critic_copy = WholeCopy(models.critic, ScoreModel) if pipelined and models.critic is not None else None
        returns_of = functools.partial(self.estimator.critic_returns, ppo=ppo_args) if (  # its values: the old ones
            one_step and self.estimator.critic_returns is not None) else None
        self.critic = make_critic(models.critic, ppo_args.clip_range_value, critic_copy, self.precision, returns_of)
        if not pipelined:
            self.micro_batches = EagerMicroBatches(self.actor_step, self.critic, ppo_args, self.compute_advantages)
        # rollout_log_probs: the sampler-vs-trainer gap from the update's own first forward passes (not pipelined)
        self.sampler_gap = scoring.SamplerGap() if ppo_args.rollout_log_probs and not pipelined else None
        strategy = self.teacher.sampler(make_sampler(ppo_args, data_args.max_length, data.collate_prompts,
                                                     env_args, self.routing.records, models.draft),
                                        data_args.max_length)  # multi-turn? GKD's mix?
        self.reward_stats = RunningMeanStd()
        self.gen_config = rollout_generation_config(ppo_args, self.actor, tokenizer)
        self.ptx, self.ptx_skip = ptx_term(data, ppo_args.ptx_coeff), 0  # ptx.py (or none); the batches resume skips
        self.ledger = Ledger(train_args.output_dir, is_main_process(), {**reward_sources(ppo_args, self.reward), **(
            self.teacher.sources())}) if async_args is not None and async_args.ledger else None  # rank 0 writes
        # the collaborators the step's strategies are given (prompt_stream.py, samplers.py, sources.py, scoring.py)
        group, pad_id = ppo_args.num_return_sequences, tokenizer.pad_token_id
        self.prompt_stream = PromptStream(data.prompts, ppo_args, train_args, data_world_size())
        self.policy_sampler = PolicySampler(
            self.actor, self.generation_copy, strategy, tokenizer, self.gen_config, ppo_args,
            ppo_args.rollout_log_probs and not self.reuse_update_log_probs,  # old log-probs from the sampling pass
            self.show_phase, self.offload, [self.actor, *self.teacher.models("generate"), *self.draft_models],
            self.precision)
        self.rollouts = rollout_source(source, self.prompt_stream, self.policy_sampler, group, pad_id)  # sources.py
        self.step_rollouts = fault_policy.GroupFaults(ds.step_rollouts(ppo_args, self.prompt_stream, self.ledger,
                                                                       pad_id), env_args, pipelined, group, self.ledger)
        env_reward_weight = env_args.env_reward_weight if env_args is not None else 0.0
        self.end_rewards = scoring.EndRewards(self.reward, self.step_rollouts, env_reward_weight, ppo_args,
                                              self.offload, self.precision)
        self.draws = StepDraws(self.rollouts, self.prompt_stream, self.policy_sampler, self.end_rewards,
                               self.step_rollouts, train_args.seed)
        self.held_out = HeldOutEvaluation(data, self.policy_sampler, self.reward, env_reward_weight,
                                          ppo_args.gold_judge, self.logger, train_args)
        self.resume_if_asked()
        self.rollouts.start(self.global_step)
        self.start_monitors(monitor_args)  # training/monitors.py: after each step, report.md at the end

    def start_data_streams(self) -> None:
        self.prompt_stream.start()
        self.ptx.start(self.ptx_skip, data_world_size(), self.args)

    # --- one step: rollout -> score -> advantages -> update ---------------------------------------------------------
    def training_step(self) -> Dict[str, float]:
        timer = PhaseTimer()
        timer.times.update(self.rollouts.before_step(self.global_step, self.actor))
        with timer.phase("generate"):  # one prompt batch, or dynamic sampling's kept groups
            rollout, rewards, metrics = self.step_rollouts(self.global_step, self.draws)
        times = timer.times
        if rollout is None:  # dynamic sampling kept no group within max_gen_batches: no update this step
            return mean_over_ranks({**metrics, **times, "skipped_steps": float(self.guard.skipped)})
        times["time/generated_tokens_per_s"] = float(rollout.response_mask.sum()) / max(times["time/generate"], 1e-9)
        speed = self.policy_sampler.speed = {"gen": f"{times['time/generated_tokens_per_s']:.0f} tok/s"}  # this rank's
        self.show_phase(phase="score", **speed)
        with timer.phase("score"):
            with self.offload.phase("score", [self.actor, self.reference, self.critic.model, self.reward.model,
                                              *self.teacher.models("score")]), \
                    self.precision.autocast():
                metrics.update(self.score(rollout, rewards))
            if not self.critic.values_in_update:  # else the update computes them after its critic passes
                metrics.update(self.compute_advantages(rollout))
            if self.ledger is not None:
                self.ledger.write(gather_lists(ledger_rows(self.global_step + 1, rollout, self.ppo)))
        self.show_phase(phase="train", **speed)
        with timer.phase("train"):
            with self.offload.phase("train", [self.actor, self.critic.model, *self.teacher.models("train")],
                                    self.offload.optimizers):
                metrics.update(self.update(rollout))
            metrics.update(self.offload.memory_log)  # GPU: allocated memory around each phase
            metrics["skipped_steps"] = float(self.guard.skipped)  # optimizer steps dropped for NaN/inf gradients
        return mean_over_ranks({**metrics, **times})

    @paddle.no_grad()
    def score(self, rollout, rewards=None) -> Dict[str, float]:
        """Score the rollout in place, phase by phase; rewards: its (end rewards, parts) when already computed
        (dynamic sampling). -> the phases' metrics."""
        diff = {**self.score_log_probs(rollout), **self.teacher.score(rollout, self.global_step)}
        rollout.old_values = self.critic.old_values(rollout, version=self.global_step)
        end_rewards, parts = rewards if rewards is not None else self.end_rewards(rollout)
        rollout.end_rewards, metrics = scoring.reward_statistics(
            end_rewards, parts, self.reward_stats if self.ppo.normalize_reward else None, self.ppo.num_return_sequences)
        metrics.update({**scoring.gold_reward(self.ppo.gold_judge, rollout), **diff})
        ended = scoring.ended_responses(rollout, self.gen_config.eos_ids)
        metrics.update(scoring.length_metrics(rollout.response_mask.sum(axis=1), ended))
        metrics.update(self.policy_sampler.metrics(rollout))
        if self.ppo.mask_truncated_responses:  # DAPO's overlong filtering: cut-off answers teach nothing
            rollout.response_mask = dapo.mask_truncated_responses(
                rollout.response_mask, paddle.to_tensor([not e for e in ended]))
        return metrics

    def score_log_probs(self, rollout) -> Dict[str, float]:
        """The old (the sampler's or the trainer's) and reference log-probs [N, R], as the first update pass's."""
        sampled = rollout.old_log_probs  # rollout_log_probs: the sampler's
        self.actor.eval()
        measured_in_update = sampled is not None and self.sampler_gap is not None and \
            self.global_step >= self.ppo.pretrain_critic_steps  # (value pretraining runs no actor forward)
        if measured_in_update:
            self.sampler_gap.arm()
        elif not self.reuse_update_log_probs:  # unless the update takes its own; its first ratios then exactly 1
            trained = first_pass_log_probs(self.policy_sampler.model(self.global_step), rollout, self.ppo, self.args,
                                           self.global_step, self.routing.around)
            rollout.old_log_probs = trained if sampled is None else sampled
        with adapters_disabled(self.reference):  # with LoRA the reference is the actor's base: adapters off
            rollout.ref_log_probs = first_pass_log_probs(self.reference, rollout, self.ppo, self.args, self.global_step)
        return {} if sampled is None or measured_in_update else scoring.log_prob_diff(sampled, trained,
                                                                                      rollout.response_mask)

    @paddle.no_grad()
    def compute_advantages(self, rollout) -> Dict[str, float]:
        mask = rollout.response_mask
        rollout.advantages, rollout.returns = self.estimator(rollout, self.ppo, sum_over_data_ranks)  # [N, R]
        out = scoring.off_policy_correction(rollout, self.global_step, self.cap)  # samples of older policies
        out["advantage/mean"] = float(rl.masked_mean(rollout.advantages, mask))
        if rollout.old_log_probs is not None:  # else actor_step reports it (reuse_update_log_probs)
            out["kl"] = float(rl.sequence_kl(rollout.old_log_probs, rollout.ref_log_probs, mask,
                                             kl_estimate(self.ppo.kl_estimator)))
        return out

    def update(self, rollout) -> Dict[str, float]:
        """update.py's loop over the rollout, its micro-batches run eagerly or through the pipeline."""
        for t in self.trained.values():
            t.model.train()
        rng = update_rng(self.args.seed, self.global_step)  # score_log_probs's first pass is the same
        gap = self.sampler_gap
        step = gap.recording_until(self.optimizer_step) if gap is not None else self.optimizer_step
        return {**run_update(rollout, self.micro_batches, step, rng, self.ppo, self.args),
                **(gap.metrics() if gap is not None else {})}

    def actor_step(self, batch, share: float, ptx_scale: float = 1.0) -> Dict[str, float]:
        """Backward of this micro-batch's `share` of the optimizer step's token-mean policy loss (+ ptx_scale of
        the ptx loss); returns its share of each statistic."""
        ppo, mask = self.ppo, batch.response_mask
        if self.global_step < ppo.pretrain_critic_steps:  # value pretraining (VAPO): only the critic learns
            return {}
        with self.precision.autocast(), self.routing.around(self.actor, batch):  # the teacher's divergence too
            log_probs, entropy, distill = self.teacher.student_pass(self.actor, batch, ppo.temperature,
                                                                    ppo.entropy_coeff > 0)
            aux_loss, moe_stats = self.routing.step_terms(self.actor, batch)  # MoE: load balance, expert load
        old_log_probs, out = batch.old_log_probs, {}
        if self.sampler_gap is not None:
            self.sampler_gap.record(log_probs, old_log_probs, mask)
        if old_log_probs is None:  # reuse_update_log_probs: this policy sampled the rollout
            old_log_probs = log_probs.detach()
            out["kl"] = float(rl.sequence_kl(old_log_probs, batch.ref_log_probs, mask, kl_estimate(ppo.kl_estimator)))
        loss, stats = actor_objective(ppo, log_probs, old_log_probs, batch.advantages, mask, batch.ref_log_probs,
                                      entropy, ppo.max_new_tokens or mask.shape[1], distill)
        entropy = entropy.detach()
        loss = loss * share
        out.update({"actor_loss": float(loss), "entropy": share * float(rl.masked_mean(entropy, mask)),
                    **{k: share * float(v) for k, v in {**stats, **moe_stats}.items()},
                    "lr": self.policy.optimizer.get_lr()})
        if aux_loss is not None:
            loss = loss + aux_loss * share
        ptx_loss, ptx_stats = self.ptx.loss(self.actor, self.precision, ptx_scale)
        if ptx_loss is not None:
            loss = loss + ptx_loss
            out.update(ptx_stats)
        self.precision.backward(loss)
        return out

    # --- evaluation (checkpoints: checkpoints.py) -----------------------------------------------------------------
    def has_eval_data(self) -> bool:
        return self.data.eval_prompts is not None or bool(self.data.eval_tasks)

    def evaluate(self) -> Dict[str, float]:
        with self.offload.phase("evaluate", [self.actor, self.reward.model]):
            return self.monitors.evaluated(self.global_step, self.held_out(self.global_step))
