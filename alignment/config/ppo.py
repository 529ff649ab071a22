"""PPO / GRPO arguments under PaddleNLP's key names, plus the knobs PaddleNLP hard-codes or lacks."""
from __future__ import annotations

import dataclasses
from typing import List, Optional

from alignment.config.choices import (ADVANTAGE_ESTIMATORS, EVAL_MODES, KL_ESTIMATORS, LR_SCHEDULERS,
                                      ROLLOUT_DECODES, parse_offload_levels)
from alignment.config.data import DataArguments
from alignment.config.parser import field
from alignment.config.training import DatasetSpecs


@dataclasses.dataclass
class PPOModelArguments:
    actor_model_name_or_path: str = field(help="Policy to train (HF-layout causal LM, usually the SFT output); "
                                               "also the frozen reference model.")
    reward_model_name_or_path: Optional[str] = field(None, help="Reward model (score-model checkpoint from "
                                                               "run_reward.py); null when only reward_funcs score.")
    reward_critic_model_name_or_path: Optional[str] = field(None, help="Critic initialisation for gae; null = the "
                                                                      "reward model (or the actor when there is none).")


@dataclasses.dataclass
class PPODataArguments(DataArguments):
    ptx_datasets: Optional[DatasetSpecs] = field(None, help="Supervised data for the ptx loss (keeps the "
                                                            "policy close to its SFT data); needs ptx_coeff > 0.")


@dataclasses.dataclass
class PPOArguments:
    advantage_estimator: str = field("gae", help=f"One of {ADVANTAGE_ESTIMATORS}: gae = PPO with a critic; the "
                                                 "others are critic-free (no critic model is built).")
    per_device_prompt_batch_size: int = field(8, help="Prompts per rollout step on each device.")
    num_return_sequences: int = field(1, help="Responses sampled per prompt (the group size of grpo / rloo).")
    max_new_tokens: Optional[int] = field(None, help="Cap on generated tokens; null = max_length - prompt length.")
    temperature: float = field(1.0, help="Sampling temperature for rollouts.")
    top_p: float = field(1.0, help="Nucleus sampling threshold for rollouts (1.0 = off).")
    top_k: int = field(0, help="Top-k sampling for rollouts (0 = off).")
    repetition_penalty: float = field(1.0, help="Repetition penalty for rollouts (1.0 = off).")
    update_iters: int = field(1, help="Passes (PPO epochs) over each rollout batch.")
    group_by_length: bool = field(True, help="Put rollouts of similar length in the same update micro-batch "
                                             "(shuffled sorted groups, as HF's group_by_length), so packed micro-"
                                             "batches carry little padding. Matters only when a rollout batch "
                                             "spans several micro-batches.")
    kl_coeff: float = field(0.02, help="Weight of the KL(actor || reference) penalty.")
    kl_estimator: str = field("k1", help=f"KL estimator, one of {KL_ESTIMATORS}.")
    kl_in_loss: bool = field(False, help="Put the KL penalty in the actor loss (GRPO style) instead of the "
                                         "per-token reward.")
    clip_range_ratio: float = field(0.2, help="PPO ratio clipping epsilon.")
    clip_range_score: float = field(50.0, help="Clip the reward model's end score to +/- this value.")
    clip_range_value: float = field(5.0, help="Critic value clipping around the rollout's values.")
    gamma: float = field(1.0, help="Discount factor of GAE / REINFORCE++ returns.")
    gae_lambda: float = field(0.95, help="GAE lambda.")
    normalize_reward: bool = field(False, help="Standardise end rewards with running statistics over training.")
    normalize_advantage: bool = field(True, help="Whiten advantages over the response tokens of each batch.")
    ptx_coeff: float = field(0.0, help="Weight of the supervised (ptx) loss on ptx_datasets.")
    reward_funcs: List[str] = field([], help="Reward functions: judge names (alignment.judges), "
                                             "'module:function' or 'path/to/file.py:function'; summed with "
                                             "reward_weights, plus the reward model's score when one is given.")
    reward_weights: List[float] = field([], help="Weights of reward_funcs (default 1.0 each).")
    gold_judge: Optional[str] = field(None, help="Offline judge reported as gold_reward, never used for training: "
                                                 "a name or function spec as in reward_funcs.")
    critic_learning_rate: float = field(5e-6, help="Critic peak learning rate.")
    critic_weight_decay: float = field(0.0, help="Critic AdamW weight decay.")
    critic_lr_scheduler_type: str = field("cosine", help=f"Critic schedule, one of {LR_SCHEDULERS}.")
    critic_warmup_ratio: float = field(0.0, help="Critic warmup fraction.")
    critic_recompute: bool = field(False, help="Activation checkpointing for the critic.")
    critic_lora: bool = field(False, help="LoRA adapters on the critic (its score head trains too), with the "
                                          "lora_rank / lora_alpha / lora_dropout / lora_target_modules of the actor.")
    critic_lora_path: Optional[str] = field(None, help="Start the critic's adapters from this saved adapter "
                                                       "directory; needs critic_lora true.")
    rollout_decode: str = field("eager", help="How rollouts run their decode steps: 'eager' (KV cache, dynamic "
                                              "graph) or 'static' (a paddle.jit.to_static program per batch size and "
                                              "cache width over a preallocated KV cache; the same tokens). On a 2-core "
                                              "CPU static ran at 0.5-0.85x of eager (benchmarks/bench_rollout.py), "
                                              "hence the default.")
    use_fusemt: bool = field(False, help="Fused-transformer rollout kernels; not available in this build yet, "
                                         "so only false is accepted.")
    eval_mode: Optional[str] = field(None, help="Which actor layout generates rollouts: null or 'tensor_parallel' = "
                                                "the training layout itself; 'single' = a whole copy of the actor "
                                                "on every rank, refreshed from the training slices before each "
                                                "rollout (no per-token collectives, one more actor in memory).")
    offload_level: str = field("", help="Space-separated host-offload levels: 'freeze_model' (reference and reward "
                                        "models), 'optimizer' (actor/critic AdamW states), 'train_model' (actor and "
                                        "critic weights); each moves to host memory outside the phases that use it.")

    def validate(self) -> None:
        if self.advantage_estimator not in ADVANTAGE_ESTIMATORS:
            raise ValueError(f"key 'advantage_estimator' must be one of {ADVANTAGE_ESTIMATORS}, "
                             f"got {self.advantage_estimator!r}")
        if self.kl_estimator not in KL_ESTIMATORS:
            raise ValueError(f"key 'kl_estimator' must be one of {KL_ESTIMATORS}, got {self.kl_estimator!r}")
        for key in ("per_device_prompt_batch_size", "num_return_sequences", "update_iters"):
            if getattr(self, key) < 1:
                raise ValueError(f"key {key!r} must be >= 1, got {getattr(self, key)}")
        for key in ("clip_range_ratio", "clip_range_score", "clip_range_value", "temperature"):
            if getattr(self, key) <= 0:
                raise ValueError(f"key {key!r} must be > 0, got {getattr(self, key)}")
        if self.advantage_estimator in ("grpo", "rloo") and self.num_return_sequences < 2:
            raise ValueError(f"advantage_estimator {self.advantage_estimator!r} compares responses within a "
                             "group: key 'num_return_sequences' must be >= 2")
        if self.max_new_tokens is not None and self.max_new_tokens < 1:
            raise ValueError(f"key 'max_new_tokens' must be >= 1, got {self.max_new_tokens}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"key 'top_p' must be in (0, 1], got {self.top_p}")
        if not (0 <= self.gamma <= 1 and 0 <= self.gae_lambda <= 1):
            raise ValueError("keys 'gamma' and 'gae_lambda' must be in [0, 1]")
        if self.kl_coeff < 0 or self.ptx_coeff < 0:
            raise ValueError("keys 'kl_coeff' and 'ptx_coeff' must be >= 0")
        if self.reward_weights and len(self.reward_weights) != len(self.reward_funcs):
            raise ValueError(f"key 'reward_weights' has {len(self.reward_weights)} entries but 'reward_funcs' has "
                             f"{len(self.reward_funcs)}")
        if self.critic_lr_scheduler_type not in LR_SCHEDULERS:
            raise ValueError(f"key 'critic_lr_scheduler_type' must be one of {LR_SCHEDULERS}")
        if self.use_fusemt:
            raise ValueError("key 'use_fusemt': fused rollout kernels are not available in this build; set it to false")
        if self.rollout_decode not in ROLLOUT_DECODES:
            raise ValueError(f"key 'rollout_decode' must be one of {ROLLOUT_DECODES}, got {self.rollout_decode!r}")
        if self.eval_mode not in EVAL_MODES:
            raise ValueError(f"key 'eval_mode' must be one of {EVAL_MODES}, got {self.eval_mode!r}")
        parse_offload_levels(self.offload_level)

    def validate_with(self, model_args, data_args, *others):
        degree = max([getattr(o, "tensor_parallel_degree", 1) for o in others] + [1])
        if self.eval_mode == "tensor_parallel" and degree == 1:
            raise ValueError("key 'eval_mode' 'tensor_parallel' needs tensor_parallel_degree > 1")
        if self.rollout_decode == "static" and degree > 1 and self.eval_mode != "single":
            raise ValueError("key 'rollout_decode' 'static' compiles a whole model: with tensor_parallel_degree > 1 "
                             "set 'eval_mode': 'single'")
        if self.critic_lora_path and not self.critic_lora:
            raise ValueError("key 'critic_lora_path' needs 'critic_lora': true")
        if self.critic_lora and not self.uses_critic:
            raise ValueError(f"key 'critic_lora': advantage_estimator {self.advantage_estimator!r} builds no critic")
        if not self.reward_funcs and model_args.reward_model_name_or_path is None:
            raise ValueError("nothing gives a reward: set 'reward_model_name_or_path' or 'reward_funcs'")
        if self.ptx_coeff > 0 and not data_args.ptx_datasets:
            raise ValueError("key 'ptx_coeff' > 0 needs 'ptx_datasets'")
        if data_args.ptx_datasets and self.ptx_coeff == 0:
            raise ValueError("key 'ptx_datasets' is set but 'ptx_coeff' is 0: the ptx data would be unused")

    @property
    def uses_critic(self) -> bool:
        return self.advantage_estimator == "gae"
