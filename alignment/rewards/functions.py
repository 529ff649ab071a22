"""Reward functions: `fn(prompts, completions, **labels) -> list[float]`, one float per completion (labels are
dataset columns such as `answer`). A spec names a registered function (REWARD_FUNCTIONS: the judges of
alignment/rewards/judges.py, `arithmetic`, `sentiment`, ..., and the rule rewards `accuracy`, `format_reward`,
`gsm8k` of alignment/rewards/rules.py), a language-model judge `judge:path/to/judge.yaml` (model_judges.py), a
`module:function`, or a `path/to/file.py:function`. Pure Python: no paddle (a local model judge loads it when asked).
"""
from __future__ import annotations

from typing import Callable, Dict, Optional

import numpy as np

from alignment.config.registry import REWARD_FUNCTIONS
from alignment.data import import_function
from alignment.rewards import judges, rules  # noqa: F401  register the built-in reward functions
from alignment.rewards.errors import RewardFunctionError

MODEL_JUDGES: Dict[str, Callable] = {}  # "judge:<file>" -> its ModelJudge, made on first use


def load_reward_function(spec: str) -> Callable:
    if spec in REWARD_FUNCTIONS:
        return REWARD_FUNCTIONS[spec]
    if spec.startswith("judge:"):  # a language-model judge described by a file (model_judges.py); one per spec
        from alignment.rewards.model_judges import ModelJudge  # and process: its model and cache load once

        if spec not in MODEL_JUDGES:
            MODEL_JUDGES[spec] = ModelJudge(spec)
        return MODEL_JUDGES[spec]
    if ":" not in spec:
        raise ValueError(f"key 'reward_funcs' / 'gold_judge': {spec!r} is neither a registered reward function "
                         f"({', '.join(sorted(REWARD_FUNCTIONS.names()))}), 'judge:<judge file>' nor "
                         "'module:function' / 'file.py:function'")
    return import_function(spec, "key 'reward_funcs' / 'gold_judge'")


def prompt_text(prompt) -> str:
    """Reward functions see the prompt as text; a multi-turn prompt is its turns joined by blank lines."""
    return prompt if isinstance(prompt, str) else "\n\n".join(prompt)


def function_scores(funcs, prompts, completions, labels) -> Dict[str, np.ndarray]:
    """{spec: scores [N]} of each (spec, fn) in `funcs`; RewardFunctionError names a function that raises or
    returns anything but one finite number per completion."""
    texts = [prompt_text(p) for p in prompts]
    out = {}
    for spec, fn in funcs:
        try:
            values = fn(texts, list(completions), **labels)
        except RewardFunctionError:  # already one line naming its source (a model judge's JudgeError)
            raise
        except Exception as err:  # a user function's bug: name it, do not hide the cause
            raise RewardFunctionError(f"reward function {spec!r} raised {type(err).__name__}: {err}") from err
        values = as_scores(spec, values, len(completions))
        bad = np.flatnonzero(~np.isfinite(values))
        if bad.size:
            i = int(bad[0])
            raise RewardFunctionError(f"reward function {spec!r} returned {values[i]} for sample {i} "
                                      f"(prompt {texts[i][:60]!r}, completion {completions[i][:60]!r})")
        out[spec] = values
    return out


def as_scores(spec: str, values, count: int) -> np.ndarray:
    """A reward function's return value as float64 [count], or RewardFunctionError saying what it was."""
    if isinstance(values, (str, bytes, dict)) or not isinstance(values, (list, tuple, np.ndarray)):
        raise RewardFunctionError(f"reward function {spec!r} returned a {type(values).__name__}; it must return a "
                                  f"list of numbers, one per completion")
    try:
        scores = np.asarray(values, dtype="float64")
    except (TypeError, ValueError):
        example = next((v for v in values if not isinstance(v, (int, float, np.number)) or isinstance(v, bool)),
                       values[0] if len(values) else None)
        raise RewardFunctionError(f"reward function {spec!r} returned a non-number ({example!r}); it must return "
                                  f"a list of numbers, one per completion") from None
    if scores.shape != (count,):
        raise RewardFunctionError(f"reward function {spec!r} returned "
                                  f"{scores.shape[0] if scores.ndim else 'a scalar'} values for {count} completions")
    return scores


def gold_scores(judge: Optional[str], prompts, completions, labels) -> Optional[np.ndarray]:
    """The offline judge's scores (never trained on), or None when no judge is configured; checked as reward
    functions' are (a NaN is an error, not a silent NaN in the logs)."""
    if judge is None:
        return None
    return function_scores([(judge, load_reward_function(judge))], prompts, completions, labels)[judge]
