"""Metrics of an evaluation over items with n samples each: pure numpy, no paddle.

pass@k is the unbiased estimator of Chen et al. 2021 ("Evaluating Large Language Models Trained on Code", eq. 1):
with n samples of which c are correct, 1 - C(n-c, k) / C(n, k), computed as a product so that large n does not
overflow. mean@n is the mean reward of all n samples; maj@k is 1 when the most frequent answer among the first
k samples (ties to the answer seen first; samples with no answer do not vote) is a correct one. Confidence
intervals are percentile bootstraps over items (Efron & Tibshirani 1993), seeded, so the same values give the same
interval bits; a paired bootstrap over the same items gives the interval of a difference. Runs repeated over
training seeds take a two-level bootstrap (seeds, then the items all runs share), so the interval holds both the
seed-to-seed spread and the item sample (Davison & Hinkley 1997, section 3.8).
"""
from __future__ import annotations

from collections import Counter
from typing import Dict, List, Optional, Sequence

import numpy as np

BOOTSTRAP_REPS = 2000
CONFIDENCE = 0.95


def pass_at_k(n: int, c: int, k: int) -> float:
    """P(at least one of k samples drawn without replacement from n is correct), c of the n correct."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass@k needs 0 <= c <= n and 1 <= k <= n, got n={n}, c={c}, k={k}")
    if n - c < k:
        return 1.0
    return float(1.0 - np.prod(1.0 - k / np.arange(n - c + 1, n + 1)))


def majority_correct(answers: Sequence[Optional[str]], correct: Sequence[bool], k: int) -> float:
    """maj@k of one item: 1.0 when the most frequent answer of the first k samples is correct (answers compare
    as normalised text; None does not vote; a tie goes to the answer seen first)."""
    votes = Counter(a for a in answers[:k] if a is not None)
    if not votes:
        return 0.0
    top = max(votes.values())
    winner = next(a for a in answers[:k] if a is not None and votes[a] == top)
    return float(any(ok for a, ok in zip(answers[:k], correct[:k]) if a == winner))


def item_metrics(rewards: Sequence[float], correct: Optional[Sequence[bool]], answers: Optional[Sequence],
                 ks: Sequence[int]) -> Dict[str, float]:
    """One item's metrics over its n samples: mean@n (the mean reward); with correctness, pass@k for each k in ks;
    with answers to vote on too, maj@k for each k > 1 in ks."""
    out = {f"mean@{len(rewards)}": float(np.mean(rewards))}
    if correct is not None:
        out.update({f"pass@{k}": pass_at_k(len(correct), int(sum(correct)), k) for k in ks})
        if answers is not None:
            out.update({f"maj@{k}": majority_correct(answers, correct, k) for k in ks if k > 1})
    return out


def bootstrap_ci(values: Sequence[float], seed: int = 0, reps: int = BOOTSTRAP_REPS,
                 confidence: float = CONFIDENCE) -> tuple:
    """(mean, low, high): the mean of per-item values and its percentile-bootstrap interval over items."""
    v = np.asarray(values, dtype="float64")  # [items]
    if v.ndim != 1 or v.size == 0:
        raise ValueError("bootstrap_ci: one value per item, at least one item")
    draws = np.random.default_rng(seed).integers(0, v.size, size=(reps, v.size))  # [reps, items]
    means = v[draws].mean(axis=1)  # [reps]
    tail = (1.0 - confidence) / 2 * 100
    low, high = np.percentile(means, [tail, 100 - tail])
    return float(v.mean()), float(low), float(high)


def paired_bootstrap(a: Sequence[float], b: Sequence[float], seed: int = 0, reps: int = BOOTSTRAP_REPS,
                     confidence: float = CONFIDENCE) -> tuple:
    """(mean difference b - a, low, high) over items evaluated in both runs, item i of a paired with item i of b:
    resampling items keeps each pair together, so what both runs find hard cancels out."""
    a, b = np.asarray(a, dtype="float64"), np.asarray(b, dtype="float64")
    if a.shape != b.shape:
        raise ValueError(f"paired_bootstrap: {a.size} and {b.size} items; the runs must cover the same items")
    return bootstrap_ci(b - a, seed, reps, confidence)


def seeds_and_items_ci(scores, seed: int = 0, reps: int = BOOTSTRAP_REPS, confidence: float = CONFIDENCE) -> tuple:
    """(mean, low, high) of an arm trained at several seeds: scores [seeds, items] (each run on the same items).
    Each draw resamples the seeds and, shared by them, the items."""
    return seeds_and_items_difference_ci(None, scores, seed, reps, confidence)


def seeds_and_items_difference_ci(a, b, seed: int = 0, reps: int = BOOTSTRAP_REPS,
                                  confidence: float = CONFIDENCE) -> tuple:
    """(mean of b - mean of a, low, high) for two arms of independent runs: a [seeds_a, items], b [seeds_b, items]
    on the same items. Each draw resamples each arm's seeds on its own and the items once for both (paired by
    item). a=None: the interval of b's mean alone."""
    b = np.asarray(b, dtype="float64")  # [seeds_b, items]
    a = np.zeros((1, b.shape[-1])) if a is None else np.asarray(a, dtype="float64")  # [seeds_a, items]
    if a.ndim != 2 or b.ndim != 2 or a.shape[1] != b.shape[1] or b.size == 0 or a.size == 0:
        raise ValueError(f"seeds x items scores with the same items: shapes {a.shape} and {b.shape}")
    rng = np.random.default_rng(seed)
    items = rng.integers(0, b.shape[1], size=(reps, b.shape[1]))  # [reps, items]
    seeds_a = rng.integers(0, a.shape[0], size=(reps, a.shape[0]))  # [reps, seeds_a]
    seeds_b = rng.integers(0, b.shape[0], size=(reps, b.shape[0]))  # [reps, seeds_b]
    item_means_a = a[:, items].mean(axis=2)  # [seeds_a, reps]: each run's mean over the drawn items
    item_means_b = b[:, items].mean(axis=2)  # [seeds_b, reps]
    reps_index = np.arange(reps)
    diffs = (item_means_b[seeds_b, reps_index[:, None]].mean(axis=1)
             - item_means_a[seeds_a, reps_index[:, None]].mean(axis=1))  # [reps]
    tail = (1.0 - confidence) / 2 * 100
    low, high = np.percentile(diffs, [tail, 100 - tail])
    return float(b.mean() - a.mean()), float(low), float(high)


def summarize(per_item: List[Dict[str, float]], seed: int = 0) -> Dict[str, Dict[str, float]]:
    """{metric: {"mean", "low", "high"}} over items, each metric's interval from the same bootstrap seed."""
    names = list(per_item[0]) if per_item else []
    out = {}
    for name in names:
        mean, low, high = bootstrap_ci([m[name] for m in per_item], seed)
        out[name] = {"mean": mean, "low": low, "high": high}
    return out


def ks_up_to(n: int) -> List[int]:
    """The k reported for n samples: 1, then powers of two below n, then n."""
    ks = [1]
    while ks[-1] * 2 < n:
        ks.append(ks[-1] * 2)
    return ks + ([n] if n > 1 else [])
