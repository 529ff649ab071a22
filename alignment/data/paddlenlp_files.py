"""PaddleNLP's documented JSONL data formats, read as they are (PaddlePaddle/PaddleNLP llm/README.md "数据准备",
llm/docs/dpo.md, llm/alignment/rl/README.md; the readers paddlenlp/trl/trl_data.py `check_preference_data`,
llm/alignment/kto/run_kto.py + paddlenlp/trl/kto_criterion.py, paddlenlp/datasets/rlhf_datasets/rl_dataset.py):

    paddlenlp-sft         {"src": str | [str], "tgt": str | [str]}: SFT (src and tgt of equal length: a multi-turn
                          dialogue) or RL prompts (tgt one shorter than src, or the label PaddleNLP's RL reads with
                          prompt_key / response_key, default src / tgt)
    paddlenlp-preference  {"src", "tgt", "response": [a, b], "sort": [x, y]}: RM / DPO pairs; the response with the
                          larger sort is chosen (check_preference_data); tgt holds the earlier assistant turns
                          (one fewer than src)
    paddlenlp-kto         {"src", "tgt", "response": [a], "sort": [1 | 0]}: KTO rows; sort 1 desirable, 0 undesirable

A bare file path in a dataset spec picks the format by the keys of the file's first row (`alignment/data/detect.py`).
"""
from __future__ import annotations

from typing import Any, ClassVar, Optional

from alignment.data.builtin import JsonRowsDataset, RowError
from alignment.inputs import FINITE, short
from alignment.data.raw import RawSample


def _turn_list(row: dict, key: str, allow_empty: bool) -> list[str]:
    """PaddleNLP's `str, List(str)` fields: a string is one turn. Every turn a non-empty string."""
    value = row.get(key)
    if value is None:
        raise RowError(f"missing key {key!r}", key)
    turns = [value] if isinstance(value, str) else value
    if not isinstance(turns, list) or not all(isinstance(turn, str) for turn in turns):
        raise RowError(f"{key!r} must be a string or a list of strings, got {short(value)}", key)
    if not turns and not allow_empty:
        raise RowError(f"{key!r} is empty", key)
    if any(not turn.strip() for turn in turns):
        raise RowError(f"{key!r} has an empty turn", key)
    return turns


def _dialogue(src: list[str], tgt: list[str]) -> list[str]:
    """src[0], tgt[0], src[1], tgt[1], ...: the alternating user / assistant turns."""
    turns = []
    for k, user in enumerate(src):
        turns.append(user)
        if k < len(tgt):
            turns.append(tgt[k])
    return turns


def _prompt(src: list[str], history: list[str]) -> str | list[str]:
    """The prompt of a preference / KTO / RL row: the last user turn after the earlier turns (one string when there
    are no earlier turns)."""
    if len(history) != len(src) - 1:
        raise RowError(f"'tgt' must have one entry fewer than 'src' (the assistant turns before the last user turn), "
                       f"got {len(src)} src and {len(history)} tgt", "tgt")
    turns = _dialogue(src, history)
    return turns[0] if len(turns) == 1 else turns


class _PaddleNLPRows(JsonRowsDataset):
    """Base of the PaddleNLP pair / KTO readers (unregistered): the length of `response` tells them apart."""

    DETECT_KEYS = (frozenset({"src", "response", "sort"}),)
    RESPONSES: ClassVar[Optional[int]] = None  # the length of `response` that tells preference from KTO rows

    WHAT: ClassVar[str] = ""  # what a row of this format is ("a preference pair")

    @classmethod
    def detect(cls, row: dict, options: dict) -> int:
        response = row.get("response")
        count = 1 if isinstance(response, str) else len(response) if isinstance(response, list) else None
        return super().detect(row, options) if count == cls.RESPONSES else 0

    def parts(self, row: dict[str, Any]) -> tuple:
        """(prompt, responses, sort values) of a row, each checked: RESPONSES answers and as many sort values."""
        src = _turn_list(row, "src", allow_empty=False)
        prompt = _prompt(src, _turn_list(row, "tgt", allow_empty=True) if "tgt" in row else [])
        responses = _turn_list(row, "response", allow_empty=False)
        if len(responses) != self.RESPONSES:
            raise RowError(f"'response' must hold {self.RESPONSES} answer(s) ({self.WHAT}; the number of responses "
                           f"tells a preference pair (2) from a KTO row (1)), got {len(responses)}", "response")
        return prompt, responses, _sort(row, self.RESPONSES)


class PaddleNLPText(JsonRowsDataset):
    NAME = "paddlenlp-sft"
    ALIASES = ("src-tgt",)
    REQUIREMENT = ("PaddleNLP SFT / RL rows need 'src' and 'tgt' (strings, or lists: as many tgt as src for a "
                   "dialogue, one fewer for a prompt); prompt_key / response_key name other columns")
    OPTIONS = ("prompt_key", "response_key")
    DETECT_KEYS = (frozenset({"src", "tgt"}),)  # src alone (an RL prompt) also fits; prompt_key renames src

    def __init__(self, path=None, *, prompt_key: Optional[str] = None, response_key: Optional[str] = None, **kwargs):
        self.prompt_key, self.response_key = prompt_key or "src", response_key or "tgt"
        super().__init__(path, **kwargs)

    @classmethod
    def detect(cls, row: dict, options: dict) -> int:
        prompt_key = options.get("prompt_key") or "src"
        if prompt_key not in row or "response" in row or "sort" in row:
            return 0
        return 1 + ((options.get("response_key") or "tgt") in row)

    def convert_row(self, row: dict[str, Any]) -> RawSample:
        src = _turn_list(row, self.prompt_key, allow_empty=False)
        tgt = _turn_list(row, self.response_key, allow_empty=True) if row.get(self.response_key) is not None else []
        if len(tgt) == len(src):  # SFT: every user turn answered; the last answer is the target
            if len(src) == 1:
                return RawSample(input=src[0], answer=tgt[0])
            turns = _dialogue(src, tgt)
            return RawSample(input=turns[:-1], answer=turns[-1], dialogue=turns)
        if len(tgt) == len(src) - 1:  # a prompt (RL) after its history
            return RawSample(input=_prompt(src, tgt))
        if len(src) == 1 and tgt:  # PaddleNLP's RL label: one prompt, tgt the reference answer(s)
            return RawSample(input=src[0], answer=tgt[0])
        raise RowError(f"{self.response_key!r} must have as many entries as {self.prompt_key!r} (a dialogue) or one "
                       f"fewer (a prompt), got {len(src)} {self.prompt_key} and {len(tgt)} {self.response_key}",
                       self.response_key)


def _sort(row: dict, count: int) -> list[float]:
    value = row.get("sort")
    if value is None:
        raise RowError("missing key 'sort'", "sort")
    values = value if isinstance(value, list) else [value]
    if len(values) != count or not all(FINITE.accepts(v) for v in values):
        raise RowError(f"'sort' must be a list of {count} number(s) (finite, one per response), got {short(value)}",
                       "sort")
    return values


class PaddleNLPPreference(_PaddleNLPRows):
    NAME = "paddlenlp-preference"
    ALIASES = ("src-tgt-response-sort",)
    REQUIREMENT = ("PaddleNLP preference rows need 'src', 'tgt' (one fewer than src), 'response' (2 answers) and "
                   "'sort' (2 numbers; the larger one is chosen)")
    RESPONSES, WHAT = 2, "a preference pair"

    def convert_row(self, row: dict[str, Any]) -> RawSample:
        prompt, responses, (first, second) = self.parts(row)
        if first == second:
            raise RowError(f"the two 'sort' values are equal ({first!r}): no answer is chosen", "sort")
        if responses[0].strip() == responses[1].strip():
            raise RowError("the two responses are identical", "response")
        chosen, rejected = (responses[0], responses[1]) if first > second else (responses[1], responses[0])
        return RawSample(input=prompt, answer=chosen, other_answer=rejected, better=True)


class PaddleNLPKTO(_PaddleNLPRows):
    NAME = "paddlenlp-kto"
    ALIASES = ("src-tgt-response-label",)
    REQUIREMENT = ("PaddleNLP KTO rows need 'src', 'tgt' (one fewer than src), 'response' (1 answer) and 'sort' "
                   "([1]: desirable, [0]: undesirable)")
    RESPONSES, WHAT = 1, "a KTO row"

    def convert_row(self, row: dict[str, Any]) -> RawSample:
        prompt, responses, (label,) = self.parts(row)
        if label not in (0, 1):
            raise RowError(f"'sort' must be [1] (desirable) or [0] (undesirable), got {short(row['sort'])}", "sort")
        return RawSample(input=prompt, answer=responses[0], desirable=label == 1)
