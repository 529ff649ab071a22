"""Distillation arguments (alignment/ppo/teacher/teacher.py, alignment/ppo/rl_math/distill.py), under TRL GKDConfig's
key names where it has them (lmbda, beta, seq_kd; the temperature is PPO's), and the distillation entry point's
defaults."""
from __future__ import annotations

import dataclasses
from typing import Optional

from alignment.config.parser import field
from alignment.config.ppo import PPOArguments, server_urls
from alignment.config.registry import ADVANTAGE_ESTIMATORS, DISTILL_LOSSES
from alignment.config.training import pipelined


@dataclasses.dataclass
class DistillArguments:
    """A teacher whose next-token distributions the policy learns (on-policy distillation, GKD)."""
    HELP_SECTIONS = {"teacher_model_name_or_path": "Distillation (a teacher model)"}

    teacher_model_name_or_path: Optional[str] = field(None, help="The teacher: a local causal LM with the student's "
                                                                 "tokenizer, or the http(s) base URL of a served "
                                                                 "model's OpenAI-style API (e.g. "
                                                                 "'http://127.0.0.1:8000/v1', vLLM's /v1/completions "
                                                                 "with prompt log-probs). null = no distillation.")
    teacher_served_model: Optional[str] = field(None, help="Served teacher: the 'model' of its requests; null = the "
                                                           "first model its /models lists.")
    teacher_top_k: int = field(20, ge=1, le=1000, help="Served teacher: top-k log-probs asked per position "
                                                       "('logprobs': k; vLLM's default limit is 20). topk_kl reads "
                                                       "them; a local teacher gives the same k from its logits.")
    teacher_server_timeout: float = field(120.0, gt=0, help="Served teacher: seconds to wait for one answer.")
    teacher_server_retries: int = field(8, ge=0, help="Served teacher: retries after connection errors, timeouts "
                                                      "and 5xx (as the reward server's); past them the run stops "
                                                      "naming the teacher.")
    teacher_server_token: Optional[str] = field(None, help="Served teacher: bearer token; null = the "
                                                           "TEACHER_SERVER_TOKEN environment variable.")
    distill_loss: str = field("sampled_kl", help="A registered distillation loss (alignment/ppo/rl_math/distill.py): "
                                                 "'sampled_kl' (on-policy distillation: the reverse KL of each "
                                                 "sampled token as a per-token advantage; any teacher), 'jsd' (GKD's "
                                                 "generalised JSD with beta over the whole vocabulary; a local "
                                                 "teacher), 'forward_kl' / 'reverse_kl' (jsd at beta 0 / 1), "
                                                 "'topk_kl' (jsd over the teacher's top-k tokens and a tail bucket).")
    distill_coeff: float = field(1.0, ge=0, help="Weight of the distillation term: of the per-token advantage "
                                                 "(sampled_kl, added to the estimator's) or of the loss (the others, "
                                                 "aggregated like the policy loss).")
    beta: float = field(0.5, ge=0, le=1, help="GKD's interpolation of jsd and topk_kl: 0 = forward KL(T || S), "
                                              "1 = reverse KL(S || T) (TRL GKDConfig's beta).")
    lmbda: float = field(1.0, ge=0, le=1, help="Fraction of steps that train on the student's own samples "
                                               "(on-policy, GKD's lambda); the others train on the dataset's "
                                               "answers (or the teacher's with seq_kd). TRL's default is 0.5; "
                                               "< 1 needs advantage_estimator 'none' and a loss other than "
                                               "sampled_kl.")
    seq_kd: bool = field(False, help="Off-policy steps (lmbda < 1) train on answers the local teacher samples "
                                     "instead of the dataset's (sequence-level KD; TRL's seq_kd).")

    @property
    def distills(self) -> bool:
        return self.teacher_model_name_or_path is not None

    @property
    def served(self) -> bool:
        return bool(self.teacher_model_name_or_path) and self.teacher_model_name_or_path.startswith(
            ("http://", "https://"))

    @property
    def loss(self) -> type:
        return DISTILL_LOSSES[self.distill_loss]

    def validate(self) -> None:
        DISTILL_LOSSES.check("distill_loss", self.distill_loss)
        if self.served:
            self.teacher_urls = server_urls(self.teacher_model_name_or_path)  # parsed once
            if self.loss.full_vocab:
                raise ValueError(f"key 'distill_loss' {self.distill_loss!r} needs the teacher's whole vocabulary: a "
                                 "served teacher gives its top-k log-probs only (use 'topk_kl' or 'sampled_kl')")
            if self.seq_kd:
                raise ValueError("key 'seq_kd' samples answers from a local teacher; the teacher is served")
        if self.loss.on_policy_only and self.lmbda < 1:
            raise ValueError(f"key 'lmbda' {self.lmbda} < 1 trains on answers the student did not sample, where "
                             f"distill_loss {self.distill_loss!r} (a policy-gradient estimate) is wrong: use 'jsd', "
                             "'forward_kl', 'reverse_kl' or 'topk_kl'")
        if self.seq_kd and self.lmbda == 1:
            raise ValueError("key 'seq_kd' acts on the off-policy steps: set lmbda < 1")

    def validate_with(self, *others) -> None:
        if not self.distills:
            return
        ppo = next(other for other in others if isinstance(other, PPOArguments))
        if self.lmbda < 1 and ppo.estimator.policy_gradient:
            still = " or ".join(repr(name) for name in ADVANTAGE_ESTIMATORS.names(
                where=lambda estimator: not estimator.policy_gradient))
            raise ValueError(f"key 'lmbda' < 1 trains on answers the policy did not sample: advantage_estimator "
                             f"{ppo.advantage_estimator!r} would take policy gradients on them; use {still} "
                             "(alignment-distill's default)")
        if self.lmbda < 1 and any(getattr(other, "rollout_ranks", 0) for other in others):
            raise ValueError("key 'lmbda' < 1 with rollout_ranks > 0: the rollout ranks sample every step")
        if self.lmbda < 1 and any(getattr(other, "multi_turn", False) for other in others):
            raise ValueError("key 'lmbda' < 1 with an 'environment': the dataset's answers are single turns")
        if self.served and ppo.temperature != 1.0:
            raise ValueError("key 'temperature' must be 1.0 with a served teacher: its log-probs are at temperature 1 "
                             "and the student's would not be comparable")
        if not self.loss.as_advantage and pipelined(others):
            raise ValueError(f"key 'distill_loss' {self.distill_loss!r} with pipeline_parallel_degree > 1 is not "
                             "supported (the loss needs the whole logits); 'sampled_kl' is")


@dataclasses.dataclass
class DistillPPOArguments(PPOArguments):
    """PPO's arguments with the distillation entry point's defaults: no reward, so no advantages from rewards
    ('none'), no KL to the reference."""

    advantage_estimator: str = field("none", help="A registered advantage estimator; 'none' (the default here) = "
                                                  "zero advantages: only the teacher teaches. Any other adds the "
                                                  "rewards' advantages (then give rewards).")
    kl_coeff: float = field(0.0, ge=0, help="Weight of the KL(actor || reference) penalty (0 here: the teacher "
                                            "is the anchor).")

    def validate_with(self, model_args, data_args, *others):
        if not any(getattr(other, "distills", False) for other in others):
            raise ValueError("key 'teacher_model_name_or_path' is required: the model whose distributions the "
                             "policy learns")
        super().validate_with(model_args, data_args, *others)
