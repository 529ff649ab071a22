"""Score models (reward, cost, critic): a LLaMA-family backbone with a linear score head.

Saved as HF's `LlamaForSequenceClassification` layout (`model.*` + `score.weight`, `num_labels` in config.json), so
transformers' `AutoModelForSequenceClassification` loads it (ERNIE 4.5 has no such class in transformers: its score
checkpoints carry no `architectures` and load here only); the score normalizer goes to `score_normalizer.json`.
Starting from a causal-LM checkpoint initialises the head (and ignores `lm_head`); a score checkpoint restores it.
"""
from __future__ import annotations

import dataclasses
from typing import NamedTuple

import paddle
import paddle.nn as nn

from alignment.models.checkpoint import PretrainedMixin
from alignment.models.config import LlamaConfig
from alignment.models.llama import LlamaModel, init_weights
from alignment.models.normalizer import NORMALIZER_TYPES, load_normalizer, make_normalizer

SCORE_TYPES = ("reward", "cost", "critic")


@dataclasses.dataclass
class ScoreConfig(LlamaConfig):
    score_type: str = "reward"  # reward | cost | critic: what the score means (critic = per-token values)
    num_labels: int = 1  # score dimension (HF's name)
    do_normalize: bool = False  # standardise scores with the normalizer's statistics
    normalizer_type: str = "RunningMeanStd"
    normalizer_momentum: float = 0.9

    def __post_init__(self):
        super().__post_init__()
        if self.score_type not in SCORE_TYPES:
            raise ValueError(f"score_type must be one of {SCORE_TYPES}, got {self.score_type!r}")
        if self.normalizer_type not in NORMALIZER_TYPES:
            raise ValueError(f"normalizer_type must be one of {NORMALIZER_TYPES}, got {self.normalizer_type!r}")

    @classmethod
    def from_dict(cls, data: dict) -> "ScoreConfig":
        data = dict(data)
        if "id2label" in data and "num_labels" not in data:
            data["num_labels"] = len(data["id2label"])
        data.pop("id2label", None)
        data.pop("label2id", None)
        return super().from_dict(data)

    def to_dict(self) -> dict:
        out = super().to_dict()
        if self.family.sequence_classification:
            out["architectures"] = [self.family.sequence_classification]
        else:  # transformers has no score-head class for the family (ERNIE 4.5): it loads here only
            out.pop("architectures")
        return out


class ScoreOutput(NamedTuple):
    scores: paddle.Tensor  # [b, s] per-token scores ([b, s, k] when num_labels k > 1)
    end_scores: paddle.Tensor  # [b] score at each row's last real token ([b, k])
    end_index: paddle.Tensor  # [b] int64 column of that token


def last_token_index(attention_mask) -> paddle.Tensor:
    """[b, s] mask -> [b] column of the last 1, for left or right padding (s - 1 for an all-zero row)."""
    s = attention_mask.shape[1]
    return (s - 1 - paddle.argmax(attention_mask.flip(axis=[1]).astype("int32"), axis=1)).astype("int64")


class ScoreModel(PretrainedMixin, nn.Layer):
    config_class = ScoreConfig
    load_allow_missing = ("score.",)
    load_ignore_unexpected = ("lm_head.",)
    peft_task_type = "SEQ_CLS"

    def __init__(self, config: ScoreConfig):
        super().__init__()
        self.config = config
        self.model = LlamaModel(config)
        self.score = nn.Linear(config.hidden_size, config.num_labels, bias_attr=False)
        init_weights(self, config.initializer_range)
        self.normalizer = make_normalizer(config.normalizer_type, config.normalizer_momentum)

    @classmethod
    def from_pretrained(cls, path: str, dtype: str = "float32", **config_overrides) -> "ScoreModel":
        model = super().from_pretrained(path, dtype=dtype, **config_overrides)
        model.load_extra_files(path)
        return model

    @property
    def head_initialised(self) -> bool:
        """True when the last from_pretrained started the score head fresh (a causal-LM checkpoint)."""
        return any(name.startswith("score.") for name in getattr(self, "initialised_on_load", []))

    def save_extra_files(self, path: str) -> None:
        self.normalizer.save(path)

    def load_extra_files(self, path: str) -> None:
        self.normalizer = load_normalizer(path, self.config.normalizer_type, self.config.normalizer_momentum)

    def forward(self, input_ids, attention_mask=None, position_ids=None) -> ScoreOutput:
        if attention_mask is None:
            attention_mask = paddle.ones_like(input_ids)
        hidden, _ = self.model(input_ids, attention_mask=attention_mask, position_ids=position_ids)  # [b, s, h]
        scores = self.score(hidden).astype("float32")  # [b, s, k]
        end_index = last_token_index(attention_mask)  # [b]
        end_scores = paddle.take_along_axis(scores, end_index.reshape([-1, 1, 1]), axis=1).squeeze(1)  # [b, k]
        if self.training and self.config.score_type != "critic":  # critic values are not end scores to track
            self.normalizer.update(end_scores.detach())
        if self.config.do_normalize:
            scores, end_scores = self.normalizer.normalize(scores), self.normalizer.normalize(end_scores)
        if self.config.num_labels == 1:
            scores, end_scores = scores.squeeze(-1), end_scores.squeeze(-1)
        return ScoreOutput(scores, end_scores, end_index)
