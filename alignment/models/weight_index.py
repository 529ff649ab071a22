"""Weight index files (`model.safetensors.index.json`, PaddleNLP's `model_state.pdparams.index.json`): which file of
a sharded checkpoint holds which tensor. An index may only name files of its own directory with the index's own
kind of weights, so a crafted index can neither make a load read outside the checkpoint nor switch readers."""
from __future__ import annotations

import os
from typing import Dict

from alignment.inputs import read_json


def read_weight_map(index_file: str, suffix: str) -> Dict[str, str]:
    """{tensor name: file name} of `index_file`; every file a plain name ending in `suffix` (`.safetensors`,
    `.pdparams`). Anything else is a ValueError naming the index."""
    index = read_json(index_file, "weight index")
    weight_map = index.get("weight_map") if isinstance(index, dict) else None
    if not isinstance(weight_map, dict):
        raise ValueError(f"{index_file}: not a valid weight index ('weight_map' is not an object)")
    for name, file in weight_map.items():
        if not _plain_file_name(file, suffix):
            raise ValueError(f"{index_file}: tensor {str(name)[:80]!r} is mapped to {str(file)[:80]!r}; an index may "
                             f"only name {suffix} files beside it")
    return weight_map


def _plain_file_name(file, suffix: str) -> bool:
    return (isinstance(file, str) and file.endswith(suffix) and file == os.path.basename(file)
            and "\\" not in file and file not in (".", "..") and "\0" not in file)
