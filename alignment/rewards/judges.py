"""Gold reward functions ("judges"): offline programs that score completions, pure Python (no paddle).

They label model-sampled preference pairs (``tools/make_preference_data.py``) and are the *gold* reward of the
RLHF demo: PPO reports gold reward before/after training, while the trained reward model is the *proxy*.

Every judge has the signature of PPO's ``reward_funcs``::

    fn(prompts: list[str], completions: list[str], **labels) -> list[float]

``labels`` are dataset columns (e.g. ``answer``) passed as lists aligned with ``prompts``; a judge ignores the
columns it does not use, and a ``None`` entry means "no label for this row". Look judges up by name with
:func:`get_judge`; they are registered reward functions (``@REWARD_FUNCTIONS.function(name)``,
alignment/config/registry.py), and ``JUDGES`` holds the ones this module registers.

Judges
------
``sentiment`` ("be positive and helpful", VADER; range [-1, 1])::

    score = clip(compound - 2.0 * degeneracy - 0.5 * [words < 3], -1, 1);   score = -1 for an empty completion

  ``compound`` is vaderSentiment's normalised compound polarity of the completion, in [-1, 1]. ``words`` are the
  lowercased word tokens (``[a-z0-9']+``). ``degeneracy`` in [0, 1] is the larger of

  * the repeated-3-gram fraction ``1 - distinct 3-grams / 3-grams`` (0 with fewer than 3 words), and
  * the excess share of the most frequent word, ``max(0, top_word_count / words - 0.25) / 0.75`` (needs >= 3
    words), so one word making up a quarter of the text or less costs nothing and ``"great great great"`` costs 1.

  A natural reply has degeneracy 0 (or close), so its score is its compound; a looped or one-word-spam reply
  falls to -1 whatever its sentiment. Ties are common for neutral text (compound 0.0), e.g. most one-line tips.

``arithmetic`` (verifier; values 0.0, 1.0 or 1.0 + ``FORMAT_BONUS`` = 1.1)::

    score = 1.0 if final_number(completion) == expected else 0.0;   + 0.1 if correct and an equation states it

  ``expected`` comes from the ``answer`` label when the row has one (a number, or reference text whose *last*
  number is taken, e.g. ``"13 + 15 = 28."`` -> 28); otherwise it is computed from the prompt: an expression
  ``a op b`` (``op`` in ``+ - x * × / ÷``, e.g. ``What is 13 + 15?``) or one of the demo word-problem templates
  (``has A ... and gets B more`` -> A+B, ``has A ... and gives B away`` -> A-B, ``buys B bags with A ... in each
  bag`` -> A*B). ``final_number`` is the last number written with digits in the completion (``-``, ``,`` thousands
  separators and decimals handled; number words such as "twenty" are not read). Numbers compare within 1e-6.
  The format bonus needs the correct answer *and* an equation ``x op y = c`` in the completion with ``x op y``
  really equal to ``c`` == expected, so a wrong answer cannot collect it. A row with no label and no parsable
  prompt scores 0.0 (use ``combined`` for mixed prompt sets).

``combined`` (routing): each row goes to ``arithmetic`` when :func:`judge_for_prompt` says so (the prompt parses
as arithmetic as above, or the row's ``answer`` label is a bare number), otherwise to ``sentiment``. The two
judges' ranges differ ([0, 1.1] vs [-1, 1]), so compare scores within one task family, or per prompt as preference
labelling does. :func:`route` gives the judge name per row.

``reasoning_gym`` (optional; needs ``pip install reasoning-gym``): accuracy on procedural reasoning-gym tasks
(e.g. ``basic_arithmetic``, ``chain_sum``). Labels: ``answer`` (the entry's answer) and ``metadata`` (the entry's
metadata dict, whose ``source_dataset`` picks the task's ``score_answer``). The answer is read from the last
``<answer>...</answer>`` tag of the completion, else the whole stripped completion. Scores in [0, 1].
"""
from __future__ import annotations

import math
import re
from collections import Counter
from typing import Any, Callable, Dict, List, Optional, Sequence

from alignment.config.registry import REWARD_FUNCTIONS

__all__ = [
    "FORMAT_BONUS",
    "JUDGES",
    "arithmetic",
    "combined",
    "degeneracy",
    "expected_from_prompt",
    "final_number",
    "get_judge",
    "judge_for_prompt",
    "reasoning_gym_accuracy",
    "route",
    "sentiment",
]

Judge = Callable[..., List[float]]

# --------------------------------------------------------------------------- sentiment

REPETITION_WEIGHT = 2.0  # score -= REPETITION_WEIGHT * degeneracy
SHORT_PENALTY = 0.5  # score -= SHORT_PENALTY when the completion has fewer than MIN_WORDS words
MIN_WORDS = 3
TOP_WORD_FREE_SHARE = 0.25  # the most frequent word may be this share of the words without penalty
EMPTY_SCORE = -1.0

_WORD = re.compile(r"[a-z0-9']+")
_analyzer = None


def _vader():
    global _analyzer
    if _analyzer is None:
        try:
            from vaderSentiment.vaderSentiment import SentimentIntensityAnalyzer
        except ImportError as error:  # pragma: no cover - depends on the environment
            raise ImportError("the 'sentiment' judge needs vaderSentiment: pip install vaderSentiment") from error
        _analyzer = SentimentIntensityAnalyzer()
    return _analyzer


def _words(text: str) -> List[str]:
    return _WORD.findall(text.lower())


def degeneracy(text: str) -> float:
    """Repetition measure in [0, 1]: max(repeated-3-gram fraction, excess share of the most frequent word)."""
    words = _words(text)
    if len(words) < MIN_WORDS:
        return 0.0
    trigrams = list(zip(words, words[1:], words[2:]))
    repeated_trigrams = 1.0 - len(set(trigrams)) / len(trigrams)
    top_share = Counter(words).most_common(1)[0][1] / len(words)
    excess_top = max(0.0, top_share - TOP_WORD_FREE_SHARE) / (1.0 - TOP_WORD_FREE_SHARE)
    return min(1.0, max(repeated_trigrams, excess_top))


def sentiment_score(completion: str) -> float:
    """The ``sentiment`` judge for one completion (formula in the module docstring)."""
    if not completion or not completion.strip():
        return EMPTY_SCORE
    compound = _vader().polarity_scores(completion)["compound"]
    score = compound - REPETITION_WEIGHT * degeneracy(completion)
    if len(_words(completion)) < MIN_WORDS:
        score -= SHORT_PENALTY
    return float(min(1.0, max(-1.0, score)))


@REWARD_FUNCTIONS.function("sentiment")
def sentiment(prompts: Sequence[str], completions: Sequence[str], **labels: Any) -> List[float]:
    """"Be positive and helpful": VADER compound minus repetition and shortness penalties, in [-1, 1]."""
    _check_lengths(prompts, completions, labels)
    return [sentiment_score(text) for text in completions]


# --------------------------------------------------------------------------- arithmetic

FORMAT_BONUS = 0.1
TOLERANCE = 1e-6

# a number: optional sign (only when not glued to a preceding word/digit, so "19-8" is 19 and 8),
# digits with optional thousands separators, optional decimals
_NUMBER = r"(?<![\w.])-?\d+(?:,\d{3})*(?:\.\d+)?"
_NUMBER_RE = re.compile(_NUMBER)
_OPS = {"+": "+", "-": "-", "−": "-", "x": "*", "X": "*", "*": "*", "×": "*", "/": "/", "÷": "/"}
_OP_CLASS = r"[+\-−xX*×/÷]"
_EXPRESSION = re.compile(rf"(-?\d+(?:\.\d+)?)\s*({_OP_CLASS})\s*(-?\d+(?:\.\d+)?)")
_EQUATION = re.compile(rf"(-?\d+(?:,\d{{3}})*(?:\.\d+)?)\s*({_OP_CLASS})\s*(-?\d+(?:,\d{{3}})*(?:\.\d+)?)\s*=\s*"
                       rf"(-?\d+(?:,\d{{3}})*(?:\.\d+)?)")
_WORD_PROBLEMS = [
    (re.compile(r"has (\d+) [^.?!]*? and gets (\d+) more", re.I), lambda a, b: a + b),
    (re.compile(r"has (\d+) [^.?!]*? and gives (\d+) away", re.I), lambda a, b: a - b),
    (re.compile(r"buys (\d+) bags with (\d+) [^.?!]*? in each bag", re.I), lambda b, a: a * b),
]


def _to_float(text: str) -> float:
    return float(text.replace(",", "").replace("−", "-"))


def _apply(a: float, op: str, b: float) -> Optional[float]:
    op = _OPS[op]
    if op == "+":
        return a + b
    if op == "-":
        return a - b
    if op == "*":
        return a * b
    return a / b if b != 0 else None


def final_number(text: Optional[str]) -> Optional[float]:
    """The last number written with digits in ``text`` (None when there is none)."""
    if not text:
        return None
    matches = _NUMBER_RE.findall(text)
    return _to_float(matches[-1]) if matches else None


def expected_from_prompt(prompt: str) -> Optional[float]:
    """The answer of an arithmetic prompt: an ``a op b`` expression, else a demo word-problem template."""
    if not isinstance(prompt, str):
        return None
    for pattern, compute in _WORD_PROBLEMS:
        match = pattern.search(prompt)
        if match:
            return float(compute(int(match.group(1)), int(match.group(2))))
    match = _EXPRESSION.search(prompt)
    if match:
        return _apply(float(match.group(1)), match.group(2), float(match.group(3)))
    return None


def _expected_from_label(label: Any) -> Optional[float]:
    if label is None or isinstance(label, bool):
        return None
    if isinstance(label, (int, float)):
        return float(label) if math.isfinite(label) else None
    if isinstance(label, str):
        return final_number(label)
    return None


def _is_number_label(label: Any) -> bool:
    if isinstance(label, bool) or label is None:
        return False
    if isinstance(label, (int, float)):
        return True
    return isinstance(label, str) and bool(re.fullmatch(r"\s*" + _NUMBER + r"\s*", label))


def _close(a: float, b: float) -> bool:
    return abs(a - b) <= TOLERANCE * max(1.0, abs(b))


def _states_equation(completion: str, expected: float) -> bool:
    for x, op, y, c in _EQUATION.findall(completion):
        value = _apply(_to_float(x), op, _to_float(y))
        if value is not None and _close(value, _to_float(c)) and _close(_to_float(c), expected):
            return True
    return False


def arithmetic_score(prompt: str, completion: str, answer: Any = None, format_bonus: float = FORMAT_BONUS) -> float:
    """The ``arithmetic`` judge for one row (formula in the module docstring)."""
    expected = _expected_from_label(answer)
    if expected is None:
        expected = expected_from_prompt(prompt)
    got = final_number(completion)
    if expected is None or got is None or not _close(got, expected):
        return 0.0
    return 1.0 + (format_bonus if _states_equation(completion, expected) else 0.0)


@REWARD_FUNCTIONS.function("arithmetic")
def arithmetic(prompts: Sequence[str], completions: Sequence[str], answer: Optional[Sequence[Any]] = None,
               **labels: Any) -> List[float]:
    """Verifier: 1.0 when the completion's final number is the expected one (+0.1 for a correct equation)."""
    _check_lengths(prompts, completions, dict(labels, answer=answer))
    answers = answer if answer is not None else [None] * len(prompts)
    return [arithmetic_score(p, c, a) for p, c, a in zip(prompts, completions, answers)]


# --------------------------------------------------------------------------- routing


def judge_for_prompt(prompt: str, answer: Any = None) -> str:
    """``"arithmetic"`` for an arithmetic-looking prompt (or a bare-number ``answer`` label), else ``"sentiment"``."""
    if expected_from_prompt(prompt) is not None or _is_number_label(answer):
        return "arithmetic"
    return "sentiment"


def route(prompts: Sequence[str], answer: Optional[Sequence[Any]] = None) -> List[str]:
    """:func:`judge_for_prompt` for each row."""
    answers = answer if answer is not None else [None] * len(prompts)
    return [judge_for_prompt(p, a) for p, a in zip(prompts, answers)]


@REWARD_FUNCTIONS.function("combined")
def combined(prompts: Sequence[str], completions: Sequence[str], answer: Optional[Sequence[Any]] = None,
             **labels: Any) -> List[float]:
    """``arithmetic`` for arithmetic-looking rows, ``sentiment`` for the rest (see :func:`judge_for_prompt`)."""
    _check_lengths(prompts, completions, dict(labels, answer=answer))
    answers = answer if answer is not None else [None] * len(prompts)
    return [arithmetic_score(p, c, a) if judge_for_prompt(p, a) == "arithmetic" else sentiment_score(c)
            for p, c, a in zip(prompts, completions, answers)]


# --------------------------------------------------------------------------- reasoning-gym (optional)

_ANSWER_TAG = re.compile(r"<answer>\s?(.*?)\s?</answer>", re.DOTALL)
_rg_scorers: Dict[str, Callable] = {}


def _rg_scorer(source_dataset: str) -> Callable:
    if source_dataset not in _rg_scorers:
        try:
            import reasoning_gym
        except ImportError as error:
            raise ImportError("the 'reasoning_gym' judge needs reasoning-gym: pip install reasoning-gym") from error
        _rg_scorers[source_dataset] = reasoning_gym.get_score_answer_fn(source_dataset)
    return _rg_scorers[source_dataset]


@REWARD_FUNCTIONS.function("reasoning_gym")
def reasoning_gym_accuracy(prompts: Sequence[str], completions: Sequence[str], answer: Sequence[Any] = None,
                           metadata: Sequence[Dict[str, Any]] = None, **labels: Any) -> List[float]:
    """Score completions of reasoning-gym entries with each task's own ``score_answer`` (in [0, 1])."""
    if answer is None or metadata is None:
        raise ValueError("reasoning_gym_accuracy needs the 'answer' and 'metadata' columns of reasoning-gym entries")
    _check_lengths(prompts, completions, dict(labels, answer=answer, metadata=metadata))
    scores = []
    for prompt, completion, gold, meta in zip(prompts, completions, answer, metadata):
        if not isinstance(meta, dict) or not meta.get("source_dataset"):
            raise ValueError(f"reasoning-gym metadata without 'source_dataset': {meta!r}")
        tags = _ANSWER_TAG.findall(completion or "")
        extracted = tags[-1].strip() if tags else (completion or "").strip()
        entry = {"question": prompt, "answer": gold, "metadata": meta}
        scores.append(float(_rg_scorer(meta["source_dataset"])(extracted or None, entry)))
    return scores


# --------------------------------------------------------------------------- registry

# the gold judges: the reward functions registered above (tools/make_preference_data.py's --judge choices)
JUDGES: Dict[str, Judge] = {name: REWARD_FUNCTIONS[name]
                            for name in REWARD_FUNCTIONS.names(where=lambda fn: fn.__module__ == __name__)}


def get_judge(name: str) -> Judge:
    """The judge registered as ``name``; ValueError listing the known names otherwise."""
    try:
        return JUDGES[name]
    except (KeyError, TypeError):
        raise ValueError(f"Unknown judge {name!r}. Known judges: {', '.join(sorted(JUDGES))}") from None


def _check_lengths(prompts: Sequence[str], completions: Sequence[str], labels: Dict[str, Any]) -> None:
    if len(prompts) != len(completions):
        raise ValueError(f"{len(prompts)} prompts but {len(completions)} completions")
    for key, values in labels.items():  # only per-row columns (lists/tuples); other keyword values pass through
        if isinstance(values, (list, tuple)) and len(values) != len(prompts):
            raise ValueError(f"label {key!r} has {len(values)} values for {len(prompts)} prompts")
