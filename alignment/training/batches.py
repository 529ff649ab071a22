"""Which items a step trains and evaluates on: seeded per-epoch orders, this rank's share, tensors of a batch.

Data order is a seeded permutation per epoch, so a run is reproducible from `seed` and a resumed run skips the
batches it already drew.
"""
from __future__ import annotations

import math
import random
from typing import Dict, Iterator, List

import numpy as np
import paddle

from alignment.parallel.distributed import shard


def set_seed(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    paddle.seed(seed)


def rng_states() -> tuple:
    """The states of the generators set_seed seeds: Python's, numpy's and Paddle's."""
    return random.getstate(), np.random.get_state(), paddle.get_rng_state()


def set_rng_states(states: tuple) -> None:
    random.setstate(states[0])
    np.random.set_state(states[1])
    paddle.set_rng_state(states[2])


def batches_per_epoch(num_items: int, batch_size: int, drop_last: bool = False) -> int:
    """Batches in one pass over the data: a last, shorter batch counts unless it is dropped."""
    return num_items // batch_size if drop_last else math.ceil(num_items / batch_size)


def planned_steps(max_steps: int, epochs: float, num_items: int, batch_size: int, drop_last: bool) -> int:
    """Steps of a run taking one batch of `batch_size` items a step: max_steps when > 0, else `epochs` passes."""
    if max_steps > 0:
        return max_steps
    return max(1, int(batches_per_epoch(num_items, batch_size, drop_last) * epochs))


def epoch_batches(num_items: int, batch_size: int, seed: int, shuffle: bool = True,
                  min_size: int = 1, drop_last: bool = False) -> Iterator[np.ndarray]:
    """Index batches forever, a fresh seeded permutation each epoch. The last batch of an epoch may be short;
    one shorter than `min_size` (the world size: every rank needs an item) is skipped, and with `drop_last`
    (PaddleNLP's dataloader_drop_last) any shorter one is."""
    if drop_last:
        min_size = batch_size
    if num_items < min_size:
        raise ValueError(f"{num_items} samples cannot be shared by {min_size} data-parallel processes" if not
                         drop_last else f"{num_items} samples do not fill one batch of {batch_size} "
                                        "(dataloader_drop_last drops shorter ones)")
    epoch = 0
    while True:
        order = np.random.default_rng(seed + epoch).permutation(num_items) if shuffle else np.arange(num_items)
        for start in range(0, num_items, batch_size):
            if len(order[start: start + batch_size]) >= min_size:
                yield order[start: start + batch_size]
        epoch += 1


def skip_batches(batches, count: int):
    """Advance a batch iterator past the `count` batches a resumed run already consumed."""
    for _ in range(count):
        next(batches)
    return batches


def eval_shards(num_items: int, batch_size: int) -> Iterator[List[int]]:
    """This rank's evaluation batches: a strided share of the items, in batches of `batch_size`."""
    mine = list(shard(range(num_items)))
    for start in range(0, len(mine), batch_size):
        yield mine[start: start + batch_size]


def to_tensors(batch: Dict[str, np.ndarray]) -> Dict[str, paddle.Tensor]:
    return {k: paddle.to_tensor(v) for k, v in batch.items()}
