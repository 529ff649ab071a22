"""Index batches of the training data: seeded epochs, the short last batch, dataloader_drop_last."""
import itertools

import pytest

from alignment.training.batches import batches_per_epoch, epoch_batches


def take(iterator, n):
    return [list(map(int, batch)) for batch in itertools.islice(iterator, n)]


def test_the_short_last_batch_is_trained_on_unless_dropped():
    kept = take(epoch_batches(10, 4, seed=0, shuffle=False), 4)
    assert kept == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9], [0, 1, 2, 3]]
    dropped = take(epoch_batches(10, 4, seed=0, shuffle=False, drop_last=True), 3)
    assert dropped == [[0, 1, 2, 3], [4, 5, 6, 7], [0, 1, 2, 3]]
    assert (batches_per_epoch(10, 4), batches_per_epoch(10, 4, drop_last=True)) == (3, 2)
    assert batches_per_epoch(8, 4, drop_last=True) == batches_per_epoch(8, 4) == 2


def test_each_epoch_is_a_fresh_seeded_permutation():
    a, b = take(epoch_batches(6, 3, seed=7), 4), take(epoch_batches(6, 3, seed=7), 4)
    assert a == b
    assert sorted(a[0] + a[1]) == sorted(a[2] + a[3]) == list(range(6)) and a[:2] != a[2:]


def test_too_few_samples_are_a_clear_error():
    with pytest.raises(ValueError, match="3 samples do not fill one batch of 4"):
        next(epoch_batches(3, 4, seed=0, drop_last=True))
    with pytest.raises(ValueError, match="cannot be shared by 4 data-parallel processes"):
        next(epoch_batches(3, 4, seed=0, min_size=4))
