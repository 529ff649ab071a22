"""How a model judge's answer becomes a score in [0, 1]: parsers registered by name (a judge file's `parser`;
alignment/config/registry.py), each with the instruction the default template ends with. Pure Python.

    number   the first number of the answer, within `range` [lo, hi] -> (x - lo) / (hi - lo)
    yes_no   P(yes) / (P(yes) + P(no)), "yes" / "no" in any case and spacing, summed: from a local judge model
             each one's exact probability as the answer's start, from an endpoint the first token's top
             log-probs; without them, an answer starting with yes / no -> 1 / 0
    letter   a letter grade, the first standalone A-F: A 1, B 0.75, C 0.5, D 0.25, E and F 0
    ranking  (group judges) the answers' numbers best first ("2 > 1 > 3"): the answer ranked r of n gets
             1 - (r - 1) / (n - 1) (RULER's idea: a group ranked against itself); a group of one gets 0.5

A parser raises Unparseable with the reason when the answer does not hold what it reads; the judge asks again.
Adding one: a subclass of JudgeParser with a NAME, an `instruction` and `__call__` (or `rank` for group=True).
"""
from __future__ import annotations

import math
import re
from typing import List, Optional, Sequence, Tuple

from alignment.config.registry import JUDGE_PARSERS, Registered

_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")
_LETTER = re.compile(r"(?<![A-Za-z])([A-F])(?![A-Za-z])")
LETTER_SCORES = {"A": 1.0, "B": 0.75, "C": 0.5, "D": 0.25, "E": 0.0, "F": 0.0}


class Unparseable(ValueError):
    """A judge's answer without the score its parser reads; the message says what was missing."""


class JudgeParser(Registered, registry=JUDGE_PARSERS):
    """__call__(text, top or None, judge options) -> score in [0, 1] (group=False), or rank(text, n, options) -> n
    scores (group=True); top: [(token text, log-prob)] of the answer's first token. needs_top_logprobs: ask the judge for the first token's top log-probs."""

    group = False
    needs_top_logprobs = False
    candidates: Tuple[str, ...] = ()  # answers whose log-probs a local judge model computes exactly
    instruction = ""

    def __call__(self, text: str, top: Optional[List[Tuple[str, float]]], options: dict) -> float:
        raise NotImplementedError

    def rank(self, text: str, n: int, options: dict) -> List[float]:
        raise NotImplementedError


class NumberParser(JudgeParser):
    NAME = "number"
    instruction = "Reply with a single number from {low} to {high}, and nothing else."

    def __call__(self, text, top, options):
        low, high = options["range"]
        match = _NUMBER.search(text)
        if match is None:
            raise Unparseable("no number in the answer")
        value = float(match.group())
        if not low <= value <= high:
            raise Unparseable(f"{value:g} is outside the range [{low:g}, {high:g}]")
        return (value - low) / (high - low)


class YesNoParser(JudgeParser):
    NAME = "yes_no"
    needs_top_logprobs = True
    candidates = ("yes", "Yes", " yes", " Yes", "no", "No", " no", " No")
    instruction = "Reply with yes or no."

    def __call__(self, text, top, options):
        if top:
            mass = {"yes": 0.0, "no": 0.0}
            for token, log_prob in top:
                word = token.strip().lower()
                if word in mass and math.isfinite(log_prob):
                    mass[word] += math.exp(log_prob)
            if mass["yes"] + mass["no"] > 0:
                return mass["yes"] / (mass["yes"] + mass["no"])
        word = text.strip().lower()
        if word.startswith("yes"):
            return 1.0
        if word.startswith("no"):
            return 0.0
        raise Unparseable("neither yes nor no among the first token's top log-probs or at the answer's start")


class LetterParser(JudgeParser):
    NAME = "letter"
    instruction = "Reply with a single letter grade from A (best) to F (worst)."

    def __call__(self, text, top, options):
        match = _LETTER.search(text)
        if match is None:
            raise Unparseable("no letter grade A-F in the answer")
        return LETTER_SCORES[match.group(1)]


class RankingParser(JudgeParser):
    NAME = "ranking"
    group = True
    instruction = ("Rank the answers from best to worst. Reply with their numbers only, best first, separated by "
                   "'>' (for example: 2 > 1 > 3).")

    def rank(self, text, n, options):
        if n == 1:
            return [0.5]
        order: List[int] = []
        for token in _NUMBER.findall(text):
            value = float(token)
            if value.is_integer() and 1 <= value <= n and int(value) not in order:
                order.append(int(value))
        if len(order) != n:
            missing = sorted(set(range(1, n + 1)) - set(order))
            raise Unparseable(f"the ranking leaves out answer(s) {missing}")
        scores = [0.0] * n
        for position, answer in enumerate(order):
            scores[answer - 1] = 1.0 - position / (n - 1)
        return scores


def parser_names(group: bool) -> Sequence[str]:
    return JUDGE_PARSERS.names(where=lambda cls: cls.group == group)
