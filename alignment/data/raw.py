"""Raw data layer: sample schema, dataset registry, dataset specs and mixing.

Pure Python (no paddle): a raw dataset yields :class:`RawSample` dicts of *text*;
tokenisation happens later in the training code.

Registering a dataset only takes a subclass with a ``NAME``::

    class MyData(RawDataset):
        NAME = "my-data"
        ALIASES = ("my-data/train",)          # optional

        def __init__(self, path=None):
            self.rows = [...]

        def __getitem__(self, index): return RawSample(input=..., answer=...)
        def __len__(self): return len(self.rows)

    RawDataset.load("my-data", path="my.jsonl")
"""
from __future__ import annotations

import math
import os
import random
import sys
from dataclasses import dataclass
from collections.abc import Sequence
from typing import Any, ClassVar, Iterator, Mapping, TypedDict, Union

import numpy as np

from alignment.config.registry import DATASETS, Registered
from alignment.data.errors import DataFormatError, user_code_error
from alignment.inputs import InputError
from alignment.data.specs import DatasetSpec, SpecsLike, parse_dataset_specs

__all__ = ["DataFormatError", "DatasetSpec", "MixSource", "MixedRawDataset", "RawDataset", "RawSample",
           "parse_dataset_specs", "samples_with"]


class RawSample(TypedDict, total=False):
    """One raw text sample. Every field is optional; each stage reads the ones it needs.

    input: the prompt (``str``) or a dialogue history (``list[str]`` of alternating
        user/assistant turns, starting and ending with a user turn).
    answer: a response to ``input`` (the SFT target, or the first side of a pair).
    other_answer: a second response to ``input`` (preference pairs).
    better: ``True`` when ``answer`` is better (more helpful) than ``other_answer``.
    safer: ``True`` when ``answer`` is safer than ``other_answer``.
    is_safe: whether ``answer`` is safe.
    is_other_safe: whether ``other_answer`` is safe.
    dialogue: a whole conversation for multi-turn SFT (``list[str]``, alternating
        user/assistant turns starting with the user and ending with the assistant).
    desirable: unpaired feedback (KTO): ``True`` when ``answer`` is a desirable response.
    columns: the row's other fields as written (a multi-turn environment's ``reset`` gets them).
    steps, step_labels: a solution's steps after ``input`` and whether each is correct (process rewards).
    messages: a whole conversation for SFT as chat messages (``list`` of ``{"role", "content"}``, roles
        system/user/assistant/tool, ending with the assistant), e.g. a tool-use trace; loss on assistant turns.
    """

    input: Union[str, list[str]]
    answer: str
    other_answer: str
    better: bool
    safer: bool
    is_safe: bool
    is_other_safe: bool
    dialogue: list[str]
    desirable: bool
    columns: dict
    steps: list[str]
    step_labels: list[bool]
    messages: list[dict[str, str]]


# --------------------------------------------------------------------------- registry

FILE_READER = "auto"  # the dataset that reads a bare path (alignment/data/detect.py)
REGISTER_HINT = ("your own layout: a RawDataset subclass with a NAME in a user_dataset_modules file "
                 "(docs/concepts/datasets.md)")


class RawDataset(Sequence, Registered, registry=DATASETS):
    """Base class of raw datasets (a read-only sequence of :class:`RawSample`);
    subclasses with a ``NAME`` register themselves in ``DATASETS`` (alignment/config/registry.py) and implement
    ``__getitem__``/``__len__``.

    ``NAME`` and ``ALIASES`` are only read from the class body that defines them, so
    helper base classes without a ``NAME`` stay unregistered and subclasses of a
    registered dataset must pick their own ``NAME`` to register.
    """

    ALIASES: ClassVar[tuple[str, ...]] = ()
    OPTIONS: ClassVar[tuple[str, ...]] = ()  # the run-wide options it takes (prompt_key, response_key), see load()

    @classmethod
    def load(cls, name: str, path: str | os.PathLike | None = None, options: Mapping[str, Any] | None = None,
             **kwargs: Any) -> RawDataset:
        """The dataset registered as ``name`` (or alias) with ``path``; an unregistered ``name`` that is an existing
        path is read by FILE_READER. ``options`` (prompt_key, ...) reach the datasets listing them in ``OPTIONS``."""
        dataset_cls = DATASETS.classes.get(name) if isinstance(name, str) else None
        if dataset_cls is None and path is None and isinstance(name, str) and os.path.exists(name):
            name, path, dataset_cls = FILE_READER, name, DATASETS.classes.get(FILE_READER)
        if dataset_cls is None:
            known = ", ".join(cls.registered_names())
            raise ValueError(f"Unknown dataset {name!r}: no registered name and no such file. Registered: {known}; "
                             f"a JSON/JSONL path is read in the format its keys show; {REGISTER_HINT}") from None
        kwargs.update({k: v for k, v in (options or {}).items() if k in dataset_cls.OPTIONS and v is not None})
        try:
            return dataset_cls(path=path, **kwargs)
        except (InputError, FileNotFoundError):
            raise  # they name the file and line already
        except Exception as err:  # noqa: BLE001 - a user dataset may raise anything: name it, in one line
            where = getattr(sys.modules.get(dataset_cls.__module__), "__file__", None) or dataset_cls.__module__
            raise user_code_error(f"dataset {name!r} ({dataset_cls.__qualname__} in {where}) failed to load",
                                  err) from None

    def __iter__(self) -> Iterator[RawSample]:
        for index in range(len(self)):
            yield self[index]


# --------------------------------------------------------------------------- mixing


@dataclass(frozen=True)
class MixSource:
    """How one spec contributed to a :class:`MixedRawDataset`."""

    name: str
    path: str | None
    proportion: float
    available: int  # samples in the loaded dataset
    selected: int  # samples taken into the mixture (with repeats)


class MixedRawDataset(RawDataset):
    """Several registered datasets mixed by proportion, deterministically for a seed.

    For each spec with ``n`` samples, ``round(n * proportion)`` samples are taken (half
    rounds up): whole copies for the integer part of the proportion, then a seeded
    subset (kept in original order) for the rest. Datasets follow each other in spec
    order; shuffling is the data loader's job. ``sources`` lists what each spec gave.
    """

    def __init__(self, specs: SpecsLike, seed: int = 42, options: Mapping[str, Any] | None = None, **load_kwargs: Any):
        self.seed = seed
        self.specs = parse_dataset_specs(specs)
        self.datasets: list[RawDataset] = []
        self.sources: list[MixSource] = []
        self._index: list[tuple[int, int]] = []
        for position, spec in enumerate(self.specs):
            dataset = RawDataset.load(spec.name, path=spec.path, options=options, **load_kwargs)
            picks = _select_indices(len(dataset), spec, random.Random(f"{seed}/{position}/{spec.name}"))
            self.datasets.append(dataset)
            self._index.extend((position, index) for index in picks)
            self.sources.append(MixSource(spec.name, spec.path, spec.proportion, len(dataset), len(picks)))

    def __getitem__(self, index: int) -> RawSample:
        position, inner = self._index[index]
        try:
            sample = self.datasets[position][inner]
        except InputError:
            raise
        except Exception as err:  # noqa: BLE001 - a user dataset's row may raise anything: name it, in one line
            raise user_code_error(self.where(index), err) from None
        check_sample(sample, self.where(index))
        return sample

    def where(self, index: int) -> str:
        """'dataset NAME sample N' of the mixture's `index` (N: the index inside that dataset)."""
        position, inner = self._index[index]
        return f"dataset {self.specs[position].name!r} sample {inner}"

    def __len__(self) -> int:
        return len(self._index)


_FLAG_FIELDS = ("better", "safer", "is_safe", "is_other_safe", "desirable")
MESSAGE_ROLES = ("system", "user", "assistant", "tool")
MAX_MIXTURE_SAMPLES = 10_000_000  # the mixture's index is a Python list in memory


MAX_SAMPLE_CHARS = 1_000_000  # text of one sample, all fields: checked before any tokeniser sees it


def check_sample(sample: Any, where: str) -> None:
    """A RawSample's fields have their types (a user dataset's `better: "false"` would silently read as True) and
    its text is at most MAX_SAMPLE_CHARS characters."""
    if not isinstance(sample, dict):
        raise DataFormatError(f"{where}: a sample must be a dict (RawSample), got {type(sample).__name__}")
    chars = sum(_text_chars(value) for value in sample.values())
    if chars > MAX_SAMPLE_CHARS:
        raise DataFormatError(f"{where}: {chars} characters of text; a sample may hold at most {MAX_SAMPLE_CHARS}")
    for key in _FLAG_FIELDS:
        if key in sample and not isinstance(sample[key], (bool, np.bool_)):
            raise DataFormatError(f"{where}: {key!r} must be true or false, got {sample[key]!r}")
    for key in ("answer", "other_answer"):
        if key in sample and not isinstance(sample[key], str):
            raise DataFormatError(f"{where}: {key!r} must be a string, got {type(sample[key]).__name__}")
    for key in ("input", "dialogue"):
        value = sample.get(key)
        if value is not None and not (isinstance(value, str) and key == "input") and not (
                isinstance(value, list) and all(isinstance(turn, str) for turn in value)):
            raise DataFormatError(f"{where}: {key!r} must be {'a string or ' if key == 'input' else ''}a list of "
                                  f"strings, got {type(value).__name__}")
    if "messages" in sample and messages_problem(sample["messages"]):
        raise DataFormatError(f"{where}: 'messages' {messages_problem(sample['messages'])}")


def _text_chars(value: Any) -> int:
    """Characters of text in a field: a string, a list of strings, or chat messages' contents."""
    if isinstance(value, str):
        return len(value)
    if isinstance(value, dict):
        return _text_chars(value.get("content"))
    return sum(_text_chars(item) for item in value) if isinstance(value, list) else 0


def messages_problem(messages: Any) -> str | None:
    """What is wrong with a `messages` field (a list of {"role", "content"} dicts, roles MESSAGE_ROLES, the last
    one the assistant's), or None."""
    if not isinstance(messages, list) or not messages:
        return "must be a non-empty list of {'role', 'content'} objects"
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or not isinstance(message.get("content"), str):
            return f"message {i} must be an object with a string 'content'"
        if message.get("role") not in MESSAGE_ROLES:
            return f"message {i} has role {message.get('role')!r}; roles are {', '.join(MESSAGE_ROLES)}"
    if messages[-1]["role"] != "assistant":
        return f"must end with an assistant message (the last is {messages[-1]['role']!r})"
    return None


def samples_with(raw: Sequence, needs, advice: str) -> Iterator[RawSample]:
    """Each sample of `raw`, checked to have the fields `needs(sample)` names: a missing one is a DataFormatError
    naming the dataset, the sample and the field, with `advice` (not a KeyError deep in tokenisation)."""
    for index in range(len(raw)):
        sample = raw[index]
        missing = [key for key in needs(sample) if sample.get(key) is None]
        if missing:
            where = raw.where(index) if isinstance(raw, MixedRawDataset) else f"sample {index}"
            raise DataFormatError(f"{where}: no {missing[0]!r} field ({advice}; fields given: {sorted(sample)})")
        yield sample


def _select_indices(size: int, spec: DatasetSpec, rng: random.Random) -> list[int]:
    target = math.floor(size * spec.proportion + 0.5)
    if target > MAX_MIXTURE_SAMPLES:
        raise ValueError(f"Dataset spec {spec.name}:{spec.proportion:g}: proportion selects {target:,} samples from "
                         f"a dataset of {size:,}; at most {MAX_MIXTURE_SAMPLES:,} per mixture")
    if size and target == 0:
        raise ValueError(
            f"Dataset spec {spec.name}:{spec.proportion:g}: proportion selects no samples "
            f"from a dataset of {size}"
        )
    copies, remainder = divmod(target, size) if size else (0, 0)
    partial = sorted(rng.sample(range(size), remainder))
    return list(range(size)) * copies + partial
