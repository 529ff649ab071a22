"""Rows for evaluation tasks from a dataset spec, read through the training data layer (the same loaders and
formats as `train_datasets` / `eval_datasets`)."""
from __future__ import annotations

import dataclasses
import os
from typing import Any, Dict, List


CHECKOUT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def dataset_rows(spec: str) -> List[Dict[str, Any]]:
    """The rows of a dataset spec (`name:proportion:path` or a path); a relative path that does not exist from the
    current directory is read from the checkout (the built-in tasks' shipped files)."""
    from alignment.data.raw import MixedRawDataset
    from alignment.data.specs import parse_dataset_specs

    specs = []
    for item in parse_dataset_specs(spec):
        path = item.path
        if path and not os.path.isabs(path) and not os.path.exists(path) and \
                os.path.exists(os.path.join(CHECKOUT, path)):
            item = dataclasses.replace(item, path=os.path.join(CHECKOUT, path))
        specs.append(item)
    raw = MixedRawDataset(specs)
    return [dict(raw[i]) for i in range(len(raw))]
