"""The evaluation harness's metrics against hand-computed values (alignment/evaluation/metrics.py)."""
import math

import numpy as np
import pytest

from alignment.evaluation.metrics import (bootstrap_ci, item_metrics, ks_up_to, majority_correct, paired_bootstrap,
                                          pass_at_k, summarize)


@pytest.mark.parametrize("n,c,k,expected", [
    (5, 2, 2, 1 - 3 / 10),             # 1 - C(3,2)/C(5,2)
    (8, 2, 3, 1 - 20 / 56),            # 1 - C(6,3)/C(8,3)
    (10, 3, 1, 0.3),                   # pass@1 = c / n
    (4, 0, 4, 0.0),
    (4, 1, 4, 1.0),                    # n - c < k: every draw of 4 holds the correct one
    (200, 1, 100, 0.5),                # 1 - C(199,100)/C(200,100) = 100/200, large n without overflow
])
def test_pass_at_k_matches_the_binomial_formula(n, c, k, expected):
    assert pass_at_k(n, c, k) == pytest.approx(expected, rel=1e-12)
    assert pass_at_k(n, c, k) == pytest.approx(1 - math.comb(n - c, k) / math.comb(n, k), rel=1e-12)


@pytest.mark.parametrize("n,c,k", [(4, 5, 1), (4, 1, 0), (4, 1, 5), (3, -1, 1)])
def test_pass_at_k_refuses_impossible_counts(n, c, k):
    with pytest.raises(ValueError, match="pass@k"):
        pass_at_k(n, c, k)


def test_majority_vote_ties_go_to_the_answer_seen_first_and_none_does_not_vote():
    answers = ["3", "4", "4", None, "3"]
    correct = [True, False, False, False, True]
    assert majority_correct(answers, correct, 5) == 1.0  # 3 and 4 tie at two votes: "3" came first
    assert majority_correct(answers, correct, 3) == 0.0  # "4" has two of three
    assert majority_correct([None, None], [False, False], 2) == 0.0
    assert majority_correct([None, "7", None], [False, True, False], 3) == 1.0  # one vote wins


def test_item_metrics_per_k():
    got = item_metrics([1.0, 0.0, 0.0, 1.0], [True, False, False, True], ["5", "2", "2", "5"], ks_up_to(4))
    assert got == {"mean@4": 0.5, "pass@1": 0.5, "pass@2": pytest.approx(1 - 1 / 6), "pass@4": 1.0,
                   "maj@2": 1.0, "maj@4": 1.0}  # both ties ("5" and "2"): "5" came first
    wrong_first = item_metrics([0.0, 1.0, 0.0], [False, True, False], ["2", "5", "2"], [1, 2, 3])
    assert wrong_first["maj@2"] == 0.0 and wrong_first["maj@3"] == 0.0 and wrong_first["pass@3"] == 1.0
    graded = item_metrics([0.25, 0.75], None, None, [1, 2])
    assert graded == {"mean@2": 0.5}
    assert ks_up_to(1) == [1] and ks_up_to(8) == [1, 2, 4, 8] and ks_up_to(6) == [1, 2, 4, 6]


def test_bootstrap_is_seeded_and_collapses_on_constant_values():
    values = np.random.default_rng(3).random(50)
    assert bootstrap_ci(values, seed=1) == bootstrap_ci(values, seed=1)
    assert bootstrap_ci(values, seed=1) != bootstrap_ci(values, seed=2)
    assert bootstrap_ci([0.4] * 20) == (pytest.approx(0.4), pytest.approx(0.4), pytest.approx(0.4))


def test_bootstrap_interval_has_the_binomial_width():
    values = np.array([1.0] * 120 + [0.0] * 280)  # p = 0.3 over 400 items
    mean, low, high = bootstrap_ci(values, seed=0, reps=4000)
    half = 1.96 * math.sqrt(0.3 * 0.7 / 400)  # the normal approximation's half-width, 0.0449
    assert mean == pytest.approx(0.3)
    assert low < 0.3 < high
    assert (high - low) / 2 == pytest.approx(half, rel=0.1)


def test_paired_bootstrap_keeps_pairs_together():
    a = np.random.default_rng(0).random(40)
    mean, low, high = paired_bootstrap(a, a + 0.1)
    assert (mean, low, high) == (pytest.approx(0.1), pytest.approx(0.1), pytest.approx(0.1))  # unpaired: wide
    with pytest.raises(ValueError, match="same items"):
        paired_bootstrap([1.0, 0.0], [1.0])


def test_summarize_gives_every_metric_an_interval():
    per_item = [{"pass@1": 1.0, "mean@1": 0.5}, {"pass@1": 0.0, "mean@1": 0.5}]
    got = summarize(per_item, seed=0)
    assert got["mean@1"] == {"mean": 0.5, "low": 0.5, "high": 0.5}
    assert got["pass@1"]["mean"] == 0.5 and got["pass@1"]["low"] == 0.0 and got["pass@1"]["high"] == 1.0


def test_seeds_and_items_with_one_seed_is_the_item_bootstrap_bit_for_bit():
    from alignment.evaluation.metrics import seeds_and_items_ci

    scores = [0.1, 0.9, 0.4, 0.4, 0.0, 1.0, 0.75]
    assert seeds_and_items_ci([scores], seed=3) == bootstrap_ci(scores, seed=3)


def test_seeds_and_items_interval_holds_the_seed_spread():
    """Runs constant over items: only the seeds vary. Three seeds at 0.5, 0.7, 0.6: a resample of all three at 0.5
    has probability 1/27 = 3.7% > 2.5%, so the interval's ends are exactly the extreme seeds."""
    from alignment.evaluation.metrics import seeds_and_items_ci

    mean, low, high = seeds_and_items_ci([[0.5] * 5, [0.7] * 5, [0.6] * 5])
    assert mean == pytest.approx(0.6) and low == pytest.approx(0.5) and high == pytest.approx(0.7)


def test_seeds_and_items_difference_pairs_items_across_arms():
    """Item difficulty varies a lot, but every item of arm b is arm a's + 0.1: pairing by item cancels it."""
    from alignment.evaluation.metrics import seeds_and_items_difference_ci

    a = [[0.0, 0.9, 0.2, 0.5, 0.8], [0.0, 0.9, 0.2, 0.5, 0.8]]
    b = [[v + 0.1 for v in a[0]]] * 3
    assert seeds_and_items_difference_ci(a, b) == pytest.approx((0.1, 0.1, 0.1))
    unpaired = seeds_and_items_difference_ci(a, [[0.9, 0.0, 0.6, 0.3, 0.3]])  # the same mean + 0.1, other items
    assert unpaired[1] < 0.0 < unpaired[2]


def test_seeds_and_items_refuses_runs_on_different_items():
    from alignment.evaluation.metrics import seeds_and_items_difference_ci

    with pytest.raises(ValueError, match="same items"):
        seeds_and_items_difference_ci([[0.1, 0.2]], [[0.1, 0.2, 0.3]])
