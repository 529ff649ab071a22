"""Raw text datasets (pure Python + ``datasets``; no paddle): registry, specs, mixing.

Importing this package registers the built-in datasets (see :mod:`alignment.data.builtin`).
"""
from alignment.data.raw import (
    DataFormatError,
    DatasetSpec,
    MixedRawDataset,
    MixSource,
    RawDataset,
    RawSample,
    parse_dataset_specs,
)
from alignment.data.user_modules import import_function, import_user_module, import_user_modules
from alignment.data.builtin import (  # noqa: E402  (registers the built-ins)
    JsonRowsDataset,
    RowError,
    load_json_file,
    resolve_data_files,
    split_hh_rlhf_transcript,
)
from alignment.data import paddlenlp_files  # noqa: E402,F401  (registers PaddleNLP's formats)
from alignment.data import process_rewards  # noqa: E402,F401  (registers the PRM step formats)
from alignment.data.detect import AutoDataset  # noqa: E402  (reads a bare path by its keys)

__all__ = [
    "AutoDataset",
    "DataFormatError",
    "DatasetSpec",
    "JsonRowsDataset",
    "MixSource",
    "MixedRawDataset",
    "RawDataset",
    "RawSample",
    "RowError",
    "import_function",
    "import_user_module",
    "import_user_modules",
    "load_json_file",
    "parse_dataset_specs",
    "resolve_data_files",
    "split_hh_rlhf_transcript",
]
