"""A data file read in the format its keys show: the `auto` dataset, and what a bare path in a dataset spec means.

`train_datasets: data/pairs.jsonl` (or PaddleNLP's `train_dataset_path: a.jsonl,b.jsonl`) names no registered
dataset: the path is read by `auto`, which looks at the keys of the file's first row and hands the file to the
registered reader whose `detect(row, options)` scores highest (the most keys matched; `DETECT_KEYS` on the readers
in builtin.py and paddlenlp_files.py). A file whose keys fit no reader, or two equally, is one line naming the file,
the keys and the formats there are, and how to register a dataset of your own.
"""
from __future__ import annotations

from typing import Any, Optional

from alignment.config.registry import DATASETS
from alignment.data.builtin import JsonRowsDataset
from alignment.data.jsonfiles import resolve_data_files, scan_records
from alignment.data.raw import REGISTER_HINT, DataFormatError, RawDataset, RawSample
from alignment.inputs import InputError, parse_json, read_text


def first_row(path: str) -> dict[str, Any]:
    """The first record of a JSON / JSONL file: its first line when that is a JSON object, else the file's first
    row as scan_records reads it (a JSON array, pretty-printed rows); errors name the file and line."""
    text = read_text(path, "data file")
    start = len(text) - len(text.lstrip())
    line = text[start:].split("\n", 1)[0]
    try:
        row = parse_json(line, path, text.count("\n", 0, start) + 1)
    except InputError:
        row = None
    return row if isinstance(row, dict) else scan_records(path)[0][1]


def readers() -> list[type]:
    """The registered readers that can recognise a file (one class per reader: the splits of a dataset share one)."""
    seen, result = set(), []
    for cls in dict.fromkeys(DATASETS.classes.values()):
        if isinstance(cls, type) and issubclass(cls, JsonRowsDataset) and cls.DETECT_KEYS:
            if cls.convert_row not in seen:
                seen.add(cls.convert_row)
                result.append(cls)
    return result


def describe_formats() -> str:
    """'paddlenlp-preference (src, response, sort), ...': each reader and the keys that select it."""
    return "; ".join(f"{cls.NAME} ({' | '.join(', '.join(sorted(keys)) for keys in cls.DETECT_KEYS)})"
                     for cls in readers())


def detect_format(row: dict[str, Any], options: dict[str, Any], where: str) -> type:
    """The reader whose `detect` scores `row` highest; a DataFormatError naming `where` when none or two tie."""
    scores = [(cls.detect(row, options), cls) for cls in readers()]
    best = max((score for score, _ in scores), default=0)
    winners = [cls for score, cls in scores if score == best and best > 0]
    if len(winners) == 1:
        return winners[0]
    keys = ", ".join(sorted(map(str, row)))
    if winners:
        names = " and ".join(cls.NAME for cls in winners)
        raise DataFormatError(f"{where}: the keys ({keys}) fit {names} equally; name one of them in the spec "
                              f"('{winners[0].NAME}:1.0:<path>')")
    raise DataFormatError(f"{where}: the keys of the first row ({keys}) fit no data format this toolkit reads: "
                          f"{describe_formats()}; name one in the spec ('paddlenlp-sft:1.0:<path>') or {REGISTER_HINT}")


class AutoDataset(RawDataset):
    """A local JSON / JSONL file or directory in whichever registered format its first row's keys show."""

    NAME = "auto"
    ALIASES = ("file",)
    OPTIONS = ("prompt_key", "response_key")

    def __init__(self, path=None, *, split: Optional[str] = None, **options: Any):
        if path is None:
            raise ValueError("dataset 'auto' needs a local path ('auto:1.0:data/train.jsonl', or the path alone)")
        files = resolve_data_files(path, split or "train")
        reader = detect_format(first_row(files[0]), options, f"{files[0]} line 1")
        given = {key: value for key, value in options.items() if value is not None and key in reader.OPTIONS}
        self.format = reader.NAME
        self.inner = reader(path, **({"split": split} if split else {}), **given)

    def __getitem__(self, index: int) -> RawSample:
        return self.inner[index]

    def __len__(self) -> int:
        return len(self.inner)
