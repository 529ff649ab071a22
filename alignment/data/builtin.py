"""Built-in raw datasets: PKU-SafeRLHF, hh-rlhf, alpaca and generic JSON/JSONL.

Each loads a local ``.json``/``.jsonl`` file (or a directory holding ``<split>.jsonl``)
with the shared reader (alignment/inputs: every value keeps the type it is written with), or the Hugging
Face hub repo with ``datasets.load_dataset`` when no path is given. Every row is validated; problems raise
:class:`DataFormatError` naming the file and line (``data/x.jsonl line 7: missing key 'response_1' (...)``).
Pass ``strict=False`` to skip invalid rows with one warning instead.
"""
from __future__ import annotations

import os
import re
import warnings
from typing import Any, ClassVar

from alignment.data.jsonfiles import json_type_name, load_json_file, resolve_data_files, scan_records
from alignment.data.raw import DataFormatError, RawDataset, RawSample, messages_problem
from alignment.inputs import short

__all__ = ["JsonRowsDataset", "RowError", "load_json_file", "resolve_data_files", "split_hh_rlhf_transcript"]


class RowError(ValueError):
    """A row does not fit the schema; the loader adds file and line to the message."""

    def __init__(self, message: str, key: str | None = None):
        super().__init__(message)
        self.key = key


# --------------------------------------------------------------------------- row checks


def _present(row: dict, key: str) -> Any:
    value = row.get(key)
    if value is None:
        raise RowError(f"missing key {key!r}", key)
    return value


def _text(row: dict, key: str, required: bool = True) -> str | None:
    value = _present(row, key) if required else row.get(key)
    if value is not None and not isinstance(value, str):
        raise RowError(f"{key!r} must be a string, got {json_type_name(value)} {short(value)}", key)
    if required and not value.strip():
        raise RowError(f"{key!r} is empty", key)
    return value


def _response_id(row: dict, key: str) -> int:
    value = _present(row, key)
    if isinstance(value, float) and value.is_integer():
        value = int(value)  # 0.0 / 1.0: JSON writers that have one number type
    if isinstance(value, bool) or value not in (0, 1):
        raise RowError(f"{key!r} must be 0 or 1, got {short(value)}", key)
    return value


def _flag(row: dict, key: str) -> bool:
    value = _present(row, key)
    if not isinstance(value, bool):
        raise RowError(f"{key!r} must be true or false, got {short(value)}", key)
    return value


def _turns(row: dict, key: str) -> list[str]:
    value = row.get(key)
    if not isinstance(value, list) or not value or not all(isinstance(turn, str) for turn in value):
        raise RowError(f"{key!r} must be a non-empty list of strings, got {short(value)}", key)
    return value


def _different(first: str, second: str, what: str) -> None:
    if first.strip() == second.strip():
        raise RowError(f"{what} are identical")


_HH_MARKER = re.compile(r"\n\n(Human|Assistant):")


def split_hh_rlhf_transcript(transcript: str) -> tuple[list[str], str]:
    """Split ``"\\n\\nHuman: q\\n\\nAssistant: a ..."`` into (turns before the final
    assistant answer, the final answer). Turns alternate user/assistant, stripped."""
    text = transcript if transcript.startswith("\n\n") else "\n\n" + transcript.lstrip()
    parts = _HH_MARKER.split(text)
    if parts[0].strip() or len(parts) < 5:
        raise RowError("transcript must start with 'Human:' and end with an 'Assistant:' turn")
    roles, turns = parts[1::2], [turn.strip() for turn in parts[2::2]]
    expected = ["Human", "Assistant"] * (len(roles) // 2)
    if roles != expected:
        raise RowError("transcript turns must alternate 'Human:' / 'Assistant:' and end with 'Assistant:'")
    return turns[:-1], turns[-1]


# --------------------------------------------------------------------------- datasets


class JsonRowsDataset(RawDataset):
    """Base of the built-ins (unregistered): subclasses set ``NAME``, ``HUB_ID``,
    ``SPLIT``, ``REQUIREMENT`` and implement :meth:`convert_row`.

    ``path``: a file, or a directory holding ``<split>`` files; ``None`` loads ``HUB_ID``
    (extra keyword arguments such as ``data_dir`` or ``revision`` go to ``load_dataset``).
    """

    HUB_ID: ClassVar[str | None] = None
    SPLIT: ClassVar[str] = "train"
    REQUIREMENT: ClassVar[str] = ""
    DETECT_KEYS: ClassVar[tuple[frozenset, ...]] = ()  # key sets a first row of this format has (data/detect.py)

    def __init__(self, path: str | os.PathLike | None = None, *, split: str | None = None,
                 strict: bool = True, **hub_kwargs: Any):
        self.split = split or self.SPLIT
        self.strict = strict
        self.samples: list[RawSample] = []
        self.skipped = 0
        if path is not None:
            if hub_kwargs:
                raise TypeError(f"{self.NAME}: unexpected arguments for a local path: {sorted(hub_kwargs)}")
            for file_path in resolve_data_files(path, self.split):
                self._add_rows(scan_records(file_path), file_path)
        else:
            self._add_rows(list(enumerate(self._load_hub_rows(hub_kwargs))), None)

    def convert_row(self, row: dict[str, Any]) -> RawSample:
        """One validated sample from a row; raise :class:`RowError` for a bad row."""
        raise NotImplementedError

    @classmethod
    def detect(cls, row: dict[str, Any], options: dict[str, Any]) -> int:
        """How specifically a file's first row fits this format: the size of the largest of `DETECT_KEYS` it holds
        (0: not this format). A bare file path is read by the format that fits best."""
        return max((len(keys) for keys in cls.DETECT_KEYS if keys <= set(row)), default=0)

    def __getitem__(self, index: int) -> RawSample:
        return dict(self.samples[index])  # type: ignore[return-value]

    def __len__(self) -> int:
        return len(self.samples)

    def _load_hub_rows(self, hub_kwargs: dict[str, Any]) -> list[dict[str, Any]]:
        if self.HUB_ID is None:
            raise ValueError(f"Dataset {self.NAME!r} needs a local path (e.g. '{self.NAME}:1.0:data/file.jsonl')")
        import datasets  # here, not at the top: over a second of every process start, for a hub download only

        try:
            return datasets.load_dataset(self.HUB_ID, split=self.split, **hub_kwargs).to_list()
        except Exception as error:  # offline, no such repo, ...: a user-fixable input problem
            raise ValueError(
                f"Dataset {self.NAME!r}: no local path given and loading {self.HUB_ID!r} (split "
                f"{self.split!r}) from the Hugging Face hub failed: {error}. Pass a local path instead."
            ) from error

    def _add_rows(self, records: list[tuple[int, dict[str, Any]]], file_path: str | None) -> None:
        """Convert (line, row) records of a file (or (index, row) of hub rows when file_path is None)."""
        first_problem = None
        skipped_before = self.skipped
        for position, row in records:
            try:
                self.samples.append(self.convert_row(row))
            except RowError as error:
                if self.strict:
                    raise self._describe(error, position, row, file_path) from None
                self.skipped += 1
                first_problem = first_problem or self._describe(error, position, row, file_path)
        if first_problem is not None:
            count = self.skipped - skipped_before
            warnings.warn(f"{self.NAME}: skipped {count} invalid row(s); first: {first_problem}", stacklevel=3)

    def _describe(self, error: RowError, position: int, row: Any, file_path: str | None) -> DataFormatError:
        message = str(error)
        if error.key and isinstance(row, dict) and error.key in row and row[error.key] is None:
            message = f"key {error.key!r} is null"
        if file_path is None:
            return DataFormatError(f"{self.HUB_ID} ({self.split}) row index {position}: {message} "
                                   f"({self.REQUIREMENT})")
        return DataFormatError(f"{file_path} line {position}: {message} ({self.REQUIREMENT})", file_path, position)


class _SafeRLHFBase(JsonRowsDataset):
    REQUIREMENT = ("PKU-SafeRLHF rows need prompt, response_0, response_1, better_response_id, "
                   "safer_response_id, is_response_0_safe, is_response_1_safe")
    DETECT_KEYS = (frozenset({"prompt", "response_0", "response_1"}),)

    def convert_row(self, row: dict[str, Any]) -> RawSample:
        prompt, answer, other = (_text(row, key) for key in ("prompt", "response_0", "response_1"))
        _different(answer, other, "response_0 and response_1")
        return RawSample(
            input=prompt, answer=answer, other_answer=other,
            better=_response_id(row, "better_response_id") == 0,
            safer=_response_id(row, "safer_response_id") == 0,
            is_safe=_flag(row, "is_response_0_safe"), is_other_safe=_flag(row, "is_response_1_safe"),
        )


def _safe_rlhf(size: str, split: str) -> type:
    """The registered dataset 'PKU-SafeRLHF{size}/{split}' (hub id PKU-Alignment/PKU-SafeRLHF{size}); a train split
    also answers to the dataset's own name and hub id."""
    name, hub_id = f"PKU-SafeRLHF{size}", f"PKU-Alignment/PKU-SafeRLHF{size}"
    body = {"__module__": __name__, "NAME": f"{name}/{split}", "HUB_ID": hub_id, "SPLIT": split,
            "ALIASES": (name, hub_id) if split == "train" else ()}
    return type(f"SafeRLHF{size.lstrip('-')}{split.title()}", (_SafeRLHFBase,), body)


SafeRLHFTrain, SafeRLHFTest, SafeRLHF30KTrain, SafeRLHF30KTest, SafeRLHF10KTrain = (
    _safe_rlhf(size, split) for size, split in (("", "train"), ("", "test"), ("-30K", "train"), ("-30K", "test"),
                                                ("-10K", "train")))


class _HhRLHFBase(JsonRowsDataset):
    REQUIREMENT = "hh-rlhf rows need chosen and rejected transcripts '\\n\\nHuman: ...\\n\\nAssistant: ...'"
    HUB_ID = "Anthropic/hh-rlhf"
    DETECT_KEYS = (frozenset({"chosen", "rejected"}),)

    def convert_row(self, row: dict[str, Any]) -> RawSample:
        history, answer = _final_answer(row, "chosen")
        _, other = _final_answer(row, "rejected")  # the shared dialogue prefix is taken from 'chosen'
        _different(answer, other, "the final answers of chosen and rejected")
        return RawSample(input=history, answer=answer, other_answer=other, better=True)


def _final_answer(row: dict[str, Any], key: str) -> tuple[list[str], str]:
    transcript = _text(row, key)
    try:
        history, answer = split_hh_rlhf_transcript(transcript)
    except RowError as error:
        raise RowError(f"{key!r}: {error}", error.key) from None
    if not answer:
        raise RowError(f"{key!r}: the final assistant answer is empty")
    return history, answer


class HhRLHFTrain(_HhRLHFBase):
    NAME = "hh-rlhf/train"
    ALIASES = ("hh-rlhf", "Anthropic/hh-rlhf")
    SPLIT = "train"


class HhRLHFTest(_HhRLHFBase):
    NAME = "hh-rlhf/test"
    SPLIT = "test"


def _instruction_prompt(row: dict[str, Any]) -> str:
    instruction = _text(row, "instruction").strip()
    extra = (_text(row, "input", required=False) or "").strip()
    return f"{instruction}\n\n{extra}" if extra else instruction


class Alpaca(JsonRowsDataset):
    NAME = "alpaca"
    ALIASES = ("tatsu-lab/alpaca",)
    HUB_ID = "tatsu-lab/alpaca"
    REQUIREMENT = "alpaca rows need instruction, output and optionally input"
    DETECT_KEYS = (frozenset({"instruction", "output"}),)

    def convert_row(self, row: dict[str, Any]) -> RawSample:
        return RawSample(input=_instruction_prompt(row), answer=_text(row, "output"))


ANSWER_KEYS = ("answer", "output", "response")


class GenericJson(JsonRowsDataset):
    """Local prompt(-answer) rows: ``prompt`` (or ``instruction`` [+ ``input``], or ``input``
    as a string or list of turns) and optionally ``answer``/``output``/``response``; or a
    ``dialogue`` list of alternating turns ending with the assistant; or ``messages``, chat messages
    (``{"role", "content"}``, roles system/user/assistant/tool) ending with the assistant."""

    NAME = "jsonl"
    ALIASES = ("prompt-only", "json")
    DETECT_KEYS = tuple(frozenset({key}) for key in ("prompt", "input", "dialogue", "messages"))
    REQUIREMENT = ("rows need prompt (or instruction/input), optionally answer/output/response, or dialogue, or "
                   "messages")

    def convert_row(self, row: dict[str, Any]) -> RawSample:
        if row.get("messages") is not None:
            problem = messages_problem(row["messages"])
            if problem:
                raise RowError(f"'messages' {problem}", "messages")
            return RawSample(messages=[{"role": m["role"], "content": m["content"]} for m in row["messages"]])
        if row.get("dialogue") is not None:
            turns = _turns(row, "dialogue")
            if len(turns) % 2:
                raise RowError("'dialogue' must have an even number of turns (user first, assistant last)")
            return RawSample(input=turns[:-1], answer=turns[-1], dialogue=turns)
        sample = RawSample(input=self._prompt(row))
        for key in ("answer", "output", "response"):
            answer = _text(row, key, required=False)
            if answer and answer.strip():
                sample["answer"] = answer
                break
        columns = {k: v for k, v in row.items()
                   if v is not None and k not in ("prompt", "instruction", "input", "dialogue", *ANSWER_KEYS)}
        if columns:
            sample["columns"] = columns
        return sample

    @staticmethod
    def _prompt(row: dict[str, Any]) -> str | list[str]:
        if row.get("prompt") is not None:
            return _text(row, "prompt")
        if row.get("instruction") is not None:
            return _instruction_prompt(row)
        if isinstance(row.get("input"), list):
            return _turns(row, "input")
        if row.get("input") is not None:
            return _text(row, "input")
        raise RowError("missing key 'prompt'", "prompt")


class Unpaired(JsonRowsDataset):
    """Unpaired feedback for KTO (TRL's unpaired layout): ``prompt``, ``completion``, ``label`` (true: desirable)."""

    NAME = "kto"
    ALIASES = ("unpaired",)
    REQUIREMENT = "kto rows need prompt, completion and a boolean label (true: desirable)"
    DETECT_KEYS = (frozenset({"prompt", "completion", "label"}),)

    def convert_row(self, row: dict[str, Any]) -> RawSample:
        return RawSample(input=_text(row, "prompt"), answer=_text(row, "completion"), desirable=_flag(row, "label"))
