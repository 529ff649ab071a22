"""Rows that repeat a prompt (GRPO's answers to one prompt): which rows share one, so a forward can run each
distinct prompt once (LlamaModel.forward_sharing_prompts in the update; the decode engine prefills a prompt that
sequences added together share once as well)."""
from __future__ import annotations

from typing import Optional, Tuple

import numpy as np
import paddle


def distinct_prompts(input_ids, attention_mask) -> Optional[Tuple[paddle.Tensor, paddle.Tensor]]:
    """(first [u]: a row per distinct prompt, inverse [b]: each row's prompt among them), or None when no prompt
    repeats. Rows count as the same prompt when their ids and masks are equal (padding ids included)."""
    keys = np.concatenate([input_ids.numpy(), attention_mask.numpy()], axis=1)
    _, first, inverse = np.unique(keys, axis=0, return_index=True, return_inverse=True)
    if len(first) == len(keys):
        return None
    return paddle.to_tensor(first, dtype="int64"), paddle.to_tensor(inverse.reshape(-1), dtype="int64")
