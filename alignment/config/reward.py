"""Arguments of the reward-model stage, under PaddleNLP's key names."""
from __future__ import annotations

import dataclasses

from alignment.config.choices import NORMALIZER_TYPES, REWARD_LOSS_TYPES
from alignment.config.parser import field


@dataclasses.dataclass
class RewardArguments:
    """The reward-model loss and its normaliser."""

    loss_type: str = field("sequence-wise", help=f"Pairwise loss: one of {REWARD_LOSS_TYPES} (token-wise compares "
                                                 "per-token scores from where the two answers diverge).")
    regularization: float = field(0.001, ge=0, help="Weight of the squared end-score penalty that keeps scores near 0.")
    normalize_score_during_training: bool = field(False, help="Standardise end scores with the normalizer's "
                                                              "running statistics inside the loss.")
    normalizer_type: str = field("RunningMeanStd", help=f"Score normalizer, one of {NORMALIZER_TYPES}; its "
                                                        "statistics are saved with the model either way.")
    normalizer_momentum: float = field(0.9, gt=0, lt=1, help="Momentum of the ExponentialMovingAverage normalizer.")
    process_reward: bool = field(False, help="Train a process reward model (PRM) on step-labelled rows (dataset "
                                             "'process-reward', e.g. Math-Shepherd) instead of a pairwise reward "
                                             "model: a causal LM scoring each step at its placeholder.")
    placeholder_token: str = field("ки", help="PRM: the text after each step where its score is read "
                                              "(Math-Shepherd's 'ки').")
    reward_tokens: str = field("+,-", help="PRM: the tokens of a correct and a wrong step, 'good,bad'.")

    def validate_with(self, *others) -> None:
        if self.process_reward and any(getattr(o, "pipeline_parallel_degree", 1) > 1 for o in others):
            raise ValueError("key 'process_reward' with pipeline_parallel_degree > 1 is not supported")

    def validate(self) -> None:
        if self.loss_type not in REWARD_LOSS_TYPES:
            raise ValueError(f"key 'loss_type' must be one of {REWARD_LOSS_TYPES}, got {self.loss_type!r}")
        if self.normalizer_type not in NORMALIZER_TYPES:
            raise ValueError(f"key 'normalizer_type' must be one of {NORMALIZER_TYPES}, got {self.normalizer_type!r}")
