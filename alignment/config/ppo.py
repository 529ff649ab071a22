"""PPO / GRPO arguments under PaddleNLP's key names, plus the knobs PaddleNLP hard-codes or lacks."""
from __future__ import annotations

import dataclasses
import functools
from typing import List, Optional, Union
from urllib.parse import urlsplit

from alignment.config.choices import (EVAL_MODES, LOSS_AGG_MODES, LR_SCHEDULERS, MOE_ROUTING_REPLAYS, ROLLOUT_DECODES,
                                      parse_offload_levels)
from alignment.config.data import DataArguments
from alignment.config.parser import field
from alignment.config.registry import ADVANTAGE_ESTIMATORS, KL_ESTIMATORS, POLICY_LOSSES
from alignment.config.speculative import SpeculativeKeys
from alignment.config.training import DatasetSpecs, pipelined


@dataclasses.dataclass
class PPOModelArguments:
    """The policy, reward and critic models."""

    actor_model_name_or_path: str = field(help="Policy to train (HF-layout causal LM, usually the SFT output); "
                                               "also the frozen reference model.")
    reward_model_name_or_path: Optional[str] = field(None, help="Reward model (score-model checkpoint from "
                                                               "run_reward.py); null when only reward_funcs score.")
    reward_critic_model_name_or_path: Optional[str] = field(None, help="Critic initialisation (for an estimator "
                                                                      "with a critic); null = the reward model (or "
                                                                      "the actor when there is none).")

    def for_reward_server(self) -> "PPOModelArguments":
        """The models to load when a reward server scores (use_rm_server): no local reward model; its path
        still initialises the critic when reward_critic_model_name_or_path is null."""
        return dataclasses.replace(self, reward_model_name_or_path=None, reward_critic_model_name_or_path=(
            self.reward_critic_model_name_or_path or self.reward_model_name_or_path))


def server_urls(value: Union[str, List[str], None]) -> List[str]:
    """'url' / 'url1,url2' / [urls] -> base URLs without a trailing '/'; ValueError names key 'reward_server'."""
    items = value.split(",") if isinstance(value, str) else list(value or [])
    urls = [item.strip().rstrip("/") for item in items if item.strip()]
    for url in urls:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"key 'reward_server': {url!r} is not an http:// or https:// URL with a host")
        try:
            parts.port
        except ValueError:
            raise ValueError(f"key 'reward_server': {url!r} has a bad port") from None
    return urls


@dataclasses.dataclass
class PPODataArguments(DataArguments):
    """Prompts (and optional supervised ptx data)."""

    ptx_datasets: Optional[DatasetSpecs] = field(None, help="Supervised data for the ptx loss (keeps the "
                                                            "policy close to its SFT data); needs ptx_coeff > 0.")


@dataclasses.dataclass
class PPOArguments(SpeculativeKeys):
    """The RL algorithm: rollout, rewards, advantages, losses, critic; speculative decoding's keys: speculative.py."""
    HELP_SECTIONS = {  # --help headings: the key that opens each section (the first: SpeculativeKeys')
        "prompt_lookup_num_tokens": "Speculative decoding of rollouts",
        "advantage_estimator": "Algorithm and rollout",
        "kl_coeff": "KL to the reference",
        "clip_range_ratio": "Policy loss (PPO clipping, DAPO / GSPO options, entropy, KL loss)",
        "enable_overlong_reward_buffer": "Reward shaping and advantages",
        "reward_funcs": "Reward sources",
        "critic_learning_rate": "Critic optimizer",
        "rollout_decode": "Rollout engine, evaluation and memory",
    }

    advantage_estimator: str = field("gae", help="A registered advantage estimator (alignment/ppo/rl_math/estimators.py): "
                                                 "gae = PPO. An estimator whose needs_critic is true (gae's, vapo's) "
                                                 "builds and trains a critic model; the others are critic-free.")
    per_device_prompt_batch_size: int = field(8, ge=1, help="Prompts per rollout step on each device.")
    num_return_sequences: int = field(1, ge=1, help="Responses sampled per prompt (the group size of the group "
                                                    "estimators).")
    max_new_tokens: Optional[int] = field(None, ge=1, help="Cap on generated tokens; null = max_length - prompt "
                                                           "length.")
    temperature: float = field(1.0, ge=1e-3, help="Sampling temperature for rollouts.")
    top_p: float = field(1.0, gt=0, le=1, help="Nucleus sampling threshold for rollouts (1.0 = off).")
    top_k: int = field(0, ge=0, help="Top-k sampling for rollouts (0 = off).")
    repetition_penalty: float = field(1.0, gt=0, help="Repetition penalty for rollouts (1.0 = off).")
    min_new_tokens: int = field(0, ge=0, help="No response ends (eos) before this many tokens, in rollouts and "
                                              "evaluation; 0 = off (PaddleNLP: min_dec_len).")
    update_iters: int = field(1, ge=1, help="Passes (PPO epochs) over each rollout batch.")
    group_by_length: bool = field(True, help="Put rollouts of similar length in the same update micro-batch "
                                             "(shuffled sorted groups, as HF's group_by_length), so packed micro-"
                                             "batches carry little padding. Matters only when a rollout batch "
                                             "spans several micro-batches.")
    shared_prompt_forward: bool = field(True, help="In the passes over a rollout (log-probs, update), run a "
                                                   "prompt that several rows of a micro-batch share (GRPO's group) "
                                                   "once, its rows attending to its keys and values; the same "
                                                   "numbers up to float rounding; a prompt's answers then stay "
                                                   "in one micro-batch when num_return_sequences divides "
                                                   "per_device_train_batch_size (whole groups are shuffled instead "
                                                   "of rows). false: every row runs its own, rows shuffled singly.")
    dynamic_sampling: bool = field(False, help="DAPO dynamic sampling: drop the prompt groups whose "
                                               "num_return_sequences rewards are all equal and generate further "
                                               "prompt batches of the stream until per_device_prompt_batch_size "
                                               "groups with differing rewards are kept (then cut to exactly that). "
                                               "Needs a critic-free estimator, num_return_sequences >= 2 and one "
                                               "data-parallel process. Logs dynamic_sampling/gen_batches, "
                                               "/kept_groups_frac, /filled and /skipped_update.")
    max_gen_batches: int = field(0, help="Dynamic sampling: at most this many generation batches per step; 0 (or "
                                         "less) = no bound, as verl's max_num_gen_batches. When the bound comes "
                                         "first the step trains on the groups kept so far, or makes no update "
                                         "when there are none.")
    curriculum: bool = field(False, help="Set aside the prompts whose last curriculum_patience groups had equal "
                                         "rewards (all right or all wrong) and draw the stream's next prompts in "
                                         "their places (alignment/ppo/rollout/curriculum.py); logs curriculum/*. Same "
                                         "needs as dynamic_sampling, which it does not combine with.")
    curriculum_patience: int = field(1, ge=1, help="Curriculum: equal-reward groups in a row that set a prompt aside.")
    kl_coeff: float = field(0.02, ge=0, help="Weight of the KL(actor || reference) penalty.")
    kl_estimator: str = field("k1", help="KL estimator of the reward, kl_in_loss and the logged kl: one registered "
                                         "in alignment/ppo/rl_math/kl.py that is not loss-only.")
    kl_in_loss: bool = field(False, help="Put the KL penalty in the actor loss (GRPO style) instead of the "
                                         "per-token reward; aggregated like the policy loss "
                                         "(loss_agg_mode).")
    clip_range_ratio: float = field(0.2, gt=0, help="PPO ratio clipping epsilon.")
    clip_range_ratio_low: Optional[float] = field(None, gt=0, lt=1, help="DAPO clip-higher: the ratio's lower clip "
                                                                         "is 1 - this; null = clip_range_ratio.")
    clip_range_ratio_high: Optional[float] = field(None, gt=0, help="DAPO clip-higher: the ratio's upper clip is "
                                                                    "1 + this (e.g. 0.28 with low 0.2); null = "
                                                                    "clip_range_ratio.")
    policy_loss_mode: str = field("ppo", help="A registered policy loss (alignment/ppo/rl_math/losses.py): 'ppo' (token "
                                              "ratios) or 'gspo' (one length-normalised ratio per sequence, clipped "
                                              "per sequence; its loss is seq-mean-token-mean).")
    loss_agg_mode: str = field("token-mean", help=f"How per-token losses become one, one of {LOSS_AGG_MODES}: "
                                                  f"'token-mean' (DAPO: over all tokens of the optimizer step), "
                                                  f"'seq-mean-token-mean' (GRPO: each response's mean, then over "
                                                  f"responses), 'seq-mean-token-sum' (sums, then over responses), "
                                                  f"'seq-mean-token-sum-norm' (Dr.GRPO: sums / max_new_tokens).")
    pg_loss_coeff: float = field(1.0, ge=0, help="Weight of the policy-gradient loss in the actor loss.")
    entropy_coeff: float = field(0.0, ge=0, help="Entropy bonus: actor loss - entropy_coeff x aggregated entropy.")
    kl_loss_coeff: float = field(0.0, ge=0, help="Weight of a KL(actor || reference) loss term (GRPO style), "
                                                 "aggregated like the policy loss; independent of kl_coeff.")
    kl_loss_estimator: str = field("low_var_kl", help="Estimator of the KL loss term: any registered in "
                                                      "alignment/ppo/rl_math/kl.py ('+': the value of the estimator with "
                                                      "k2's gradient).")
    enable_overlong_reward_buffer: bool = field(False, help="DAPO soft overlong punishment: responses longer than "
                                                            "max_new_tokens - overlong_reward_buffer lose reward "
                                                            "linearly, up to overlong_penalty_factor at "
                                                            "max_new_tokens.")
    overlong_reward_buffer: int = field(0, ge=0, help="Tokens before max_new_tokens where the overlong penalty "
                                                      "starts.")
    overlong_penalty_factor: float = field(1.0, ge=0, help="Reward lost by a response of max_new_tokens tokens.")
    mask_truncated_responses: bool = field(False, help="Leave responses cut at max_new_tokens without an end "
                                                       "token out of the policy and value losses (DAPO's "
                                                       "overlong filtering).")
    clip_range_score: float = field(50.0, gt=0, help="Clip the reward model's end score to +/- this value.")
    clip_range_value: float = field(5.0, gt=0, help="Critic value clipping around the rollout's values.")
    gamma: float = field(1.0, ge=0, le=1, help="Discount factor of GAE / REINFORCE++ returns.")
    gae_lambda: float = field(0.95, ge=0, le=1, help="GAE lambda.")
    vapo_length_alpha: float = field(0.05, gt=0, help="VAPO's length-adaptive policy lambda 1 - 1 / (alpha x response "
                                                      "length) (advantage_estimator vapo).")
    pretrain_critic_steps: int = field(0, ge=0, help="Value pretraining (VAPO; PaddleNLP's key): for the first this "
                                                     "many steps only the critic trains, the policy stays as it is.")
    normalize_reward: bool = field(False, help="Standardise end rewards with running statistics over training.")
    normalize_advantage: bool = field(True, help="Whiten advantages over the response tokens of each batch.")
    ptx_coeff: float = field(0.0, ge=0, help="Weight of the supervised (ptx) loss on ptx_datasets.")
    reward_funcs: List[str] = field([], help="Reward functions: judge names (alignment.judges), "
                                             "'module:function' or 'path/to/file.py:function'; summed with "
                                             "reward_weights, plus the reward model's score when one is given.")
    reward_weights: List[float] = field([], help="Weights of reward_funcs (default 1.0 each).")
    use_rm_server: bool = field(False, help="Score with an HTTP reward server (python tools/reward_server.py, or "
                                            "any server of PaddleNLP's POST / protocol) instead of a local reward "
                                            "model; reward_model_name_or_path is then not loaded (it still "
                                            "initialises the critic when reward_critic_model_name_or_path is null). "
                                            "reward_funcs and gold_judge still run here.")
    reward_server: Optional[Union[str, List[str]]] = field(None, help="Base URL(s) of the reward server(s), e.g. "
                                                                      "'http://127.0.0.1:8731'; a list (or comma-"
                                                                      "separated) spreads requests over them and "
                                                                      "fails over when one is down.")
    reward_server_timeout: float = field(60.0, gt=0, help="Seconds to wait for one reward-server response before it "
                                                          "counts as failed (and is retried).")
    reward_server_retries: int = field(8, ge=0, help="Retries of a reward-server request after connection errors, "
                                                     "timeouts, 5xx and 503 (over all URLs); past them the run stops "
                                                     "with an error naming the URLs (the last checkpoint is intact).")
    reward_server_backoff: float = field(0.5, ge=0, help="Seconds before the first retry round; doubled each round "
                                                         "(at most 16 s; longer when the server sends Retry-After).")
    reward_server_batch_size: int = field(0, ge=0, help="Rows per reward-server request; 0 = a whole rollout batch in "
                                                        "one request, which the server scores as one forward pass "
                                                        "(bitwise the in-process reward). Set it to spread large "
                                                        "batches over several URLs.")
    reward_server_token: Optional[str] = field(None, help="Bearer token the reward server wants; null = the "
                                                          "REWARD_SERVER_TOKEN environment variable (preferred: a "
                                                          "token given here is written to args.json).")
    gold_judge: Optional[str] = field(None, help="Offline judge reported as gold_reward, never used for training: "
                                                 "a name or function spec as in reward_funcs.")
    critic_learning_rate: float = field(5e-6, gt=0, help="Critic peak learning rate.")
    critic_weight_decay: float = field(0.0, ge=0, help="Critic AdamW weight decay.")
    critic_lr_scheduler_type: str = field("cosine", help=f"Critic schedule, one of {LR_SCHEDULERS}.")
    critic_warmup_ratio: float = field(0.0, ge=0, lt=1, help="Critic warmup fraction.")
    critic_min_learning_rate: float = field(0.0, ge=0, help="The critic's learning rate at the end of its "
                                                            "linear/cosine decay (PaddleNLP's key).")
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
    rollout_log_probs: bool = field(False, help="Take the old log-probs that PPO's ratio and KL start from from "
                                                "the logits each token was sampled with (TRL's PPO does this), "
                                                "instead of the trainer's own pass over the rollout (PaddleNLP, "
                                                "OpenRLHF and verl recompute them; the recomputed ones are bitwise "
                                                "the first update pass's, whose ratios are then exactly 1). The two "
                                                "differ by float rounding here (KV-cache decode vs one whole-sequence "
                                                "pass); the difference is logged every step "
                                                "(rollout/log_prob_diff_max, rollout/log_prob_diff_p99), measured on "
                                                "the update's forward passes before its first optimizer step (no "
                                                "extra pass; a pipelined run makes one). "
                                                "Critic-free estimators with one pass and one optimizer step take "
                                                "them from the update itself either way.")
    moe_routing_replay: str = field("none", help="MoE policies: 'rollout' routes the trainer's passes over a rollout "
                                                 "(old log-probs, update) to the sampler's experts (R3); 'none': each "
                                                 "pass routes itself. The reference always routes itself.")
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
        POLICY_LOSSES.check("policy_loss_mode", self.policy_loss_mode)
        if self.loss_agg_mode not in LOSS_AGG_MODES:
            raise ValueError(f"key 'loss_agg_mode' must be one of {LOSS_AGG_MODES}, got {self.loss_agg_mode!r}")
        KL_ESTIMATORS.check("kl_loss_estimator", self.kl_loss_estimator)
        if self.critic_min_learning_rate > self.critic_learning_rate:
            raise ValueError("key 'critic_min_learning_rate' must be at most critic_learning_rate")
        if self.enable_overlong_reward_buffer and self.overlong_reward_buffer < 1:
            raise ValueError("key 'overlong_reward_buffer' must be >= 1 when 'enable_overlong_reward_buffer' is true")
        if self.loss_agg_mode == "seq-mean-token-sum-norm" and self.max_new_tokens is None:
            raise ValueError("key 'loss_agg_mode' seq-mean-token-sum-norm (Dr.GRPO) divides by max_new_tokens: set it "
                             "(without it the constant would be each micro-batch's longest response, and the "
                             "loss would depend on how the batch is split)")
        if self.enable_overlong_reward_buffer and self.max_new_tokens is None:
            raise ValueError("key 'enable_overlong_reward_buffer' needs max_new_tokens (the length it counts from)")
        if self.enable_overlong_reward_buffer and self.overlong_reward_buffer > self.max_new_tokens:
            raise ValueError(f"key 'overlong_reward_buffer' ({self.overlong_reward_buffer}) must be <= "
                             f"max_new_tokens ({self.max_new_tokens})")
        ADVANTAGE_ESTIMATORS.check("advantage_estimator", self.advantage_estimator)
        KL_ESTIMATORS.check("kl_estimator", self.kl_estimator, where=lambda kl: not kl.loss_only)
        smallest = self.estimator.min_group_size
        if self.num_return_sequences < smallest:
            raise ValueError(f"advantage_estimator {self.advantage_estimator!r} compares responses within a "
                             f"group: key 'num_return_sequences' must be >= {smallest}")
        if self.dynamic_sampling and self.curriculum:
            raise ValueError("keys 'dynamic_sampling' and 'curriculum' both choose prompts by their groups' rewards "
                             "(after and before sampling): set one of them")
        filtering = "dynamic_sampling" if self.dynamic_sampling else "curriculum" if self.curriculum else None
        if filtering and (self.uses_critic or self.num_return_sequences < 2):
            critic_free = ADVANTAGE_ESTIMATORS.names(where=lambda estimator: not estimator.needs_critic)
            raise ValueError(f"key '{filtering}' filters groups of responses to one prompt by their rewards: it "
                             f"needs a critic-free advantage_estimator ({', '.join(critic_free)}) and "
                             f"num_return_sequences >= 2, got {self.advantage_estimator!r} and "
                             f"{self.num_return_sequences}")
        if self.reward_weights and len(self.reward_weights) != len(self.reward_funcs):
            raise ValueError(f"key 'reward_weights' has {len(self.reward_weights)} entries but 'reward_funcs' has "
                             f"{len(self.reward_funcs)}")
        if self.critic_lr_scheduler_type not in LR_SCHEDULERS:
            raise ValueError(f"key 'critic_lr_scheduler_type' must be one of {LR_SCHEDULERS}")
        if self.use_fusemt:
            raise ValueError("key 'use_fusemt': fused rollout kernels are not available in this build; set it to false")
        if self.rollout_decode not in ROLLOUT_DECODES:
            raise ValueError(f"key 'rollout_decode' must be one of {ROLLOUT_DECODES}, got {self.rollout_decode!r}")
        self.validate_speculative(self.rollout_decode)
        if self.moe_routing_replay not in MOE_ROUTING_REPLAYS:
            raise ValueError(f"key 'moe_routing_replay' must be one of {MOE_ROUTING_REPLAYS}, got "
                             f"{self.moe_routing_replay!r}")
        if self.eval_mode not in EVAL_MODES:
            raise ValueError(f"key 'eval_mode' must be one of {EVAL_MODES}, got {self.eval_mode!r}")
        self.offload_levels  # noqa: B018  parsed here, so a bad level is an argument error
        self.validate_reward_server()

    def validate_reward_server(self) -> None:
        self.reward_server_urls = server_urls(self.reward_server)  # parsed once: the client takes these
        if self.use_rm_server and not self.reward_server_urls:
            raise ValueError("key 'reward_server' must name at least one URL when 'use_rm_server' is true")
        if self.reward_server_urls and not self.use_rm_server:
            raise ValueError("key 'reward_server' is set but 'use_rm_server' is false: the server would be unused")

    def validate_with(self, model_args, data_args, *others):
        degree = max([getattr(o, "tensor_parallel_degree", 1) for o in others] + [1])
        if self.eval_mode == "tensor_parallel" and degree == 1:
            raise ValueError("key 'eval_mode' 'tensor_parallel' needs tensor_parallel_degree > 1")
        if self.rollout_decode == "static" and degree > 1 and self.eval_mode != "single":
            raise ValueError("key 'rollout_decode' 'static' compiles a whole model: with tensor_parallel_degree > 1 "
                             "set 'eval_mode': 'single'")
        if self.critic_lora_path and not self.critic_lora:
            raise ValueError("key 'critic_lora_path' needs 'critic_lora': true")
        if self.critic_lora and pipelined(others):
            raise ValueError("key 'critic_lora': LoRA with pipeline_parallel_degree > 1 is not supported")
        if self.critic_lora and not self.uses_critic:
            raise ValueError(f"key 'critic_lora': advantage_estimator {self.advantage_estimator!r} builds no critic")
        environment = any(getattr(other, "multi_turn", False) for other in others)  # its rewards may be all
        teacher = any(getattr(other, "distills", False) for other in others)  # or the teacher teaches alone
        if not (self.reward_funcs or model_args.reward_model_name_or_path or self.use_rm_server or environment
                or teacher):
            raise ValueError("nothing gives a reward: set 'reward_model_name_or_path', 'use_rm_server', "
                             "'reward_funcs', 'environment' or 'teacher_model_name_or_path'")
        if self.pretrain_critic_steps and not self.uses_critic:
            raise ValueError(f"key 'pretrain_critic_steps': advantage_estimator {self.advantage_estimator!r} has no "
                             "critic to pretrain")
        if self.pretrain_critic_steps and pipelined(others):
            raise ValueError("key 'pretrain_critic_steps' with pipeline_parallel_degree > 1 is not supported")
        if self.ptx_coeff > 0 and not data_args.ptx_datasets:
            raise ValueError("key 'ptx_coeff' > 0 needs 'ptx_datasets'")
        if data_args.ptx_datasets and self.ptx_coeff == 0:
            raise ValueError("key 'ptx_datasets' is set but 'ptx_coeff' is 0: the ptx data would be unused")

    @property
    def estimator(self) -> type:
        """The advantage estimator's class (its traits: needs_critic, min_group_size, uses_old_log_probs)."""
        return ADVANTAGE_ESTIMATORS[self.advantage_estimator]

    @property
    def uses_critic(self) -> bool:
        return self.estimator.needs_critic

    def critic_training(self, train_args):
        """The critic's optimizer and schedule: train_args with the critic_* keys in place of the actor's."""
        return dataclasses.replace(train_args, learning_rate=self.critic_learning_rate,
                                   min_learning_rate=self.critic_min_learning_rate,
                                   weight_decay=self.critic_weight_decay,
                                   lr_scheduler_type=self.critic_lr_scheduler_type,
                                   warmup_ratio=self.critic_warmup_ratio, warmup_steps=0)

    @functools.cached_property
    def offload_levels(self) -> frozenset:
        """offload_level parsed, once: validate() parses it and the trainer reads the result."""
        return parse_offload_levels(self.offload_level)
