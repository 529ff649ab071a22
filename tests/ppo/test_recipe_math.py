"""Golden tests of the recipes of PaddleNLP's llm/alignment/rl and verl in alignment/ppo/rl_math/surrogate.py,
losses.py, kl.py and dapo.py: loss aggregation modes, clip-higher, GSPO, the entropy bonus, KL as a loss term,
dynamic sampling's group filter, overlong shaping and truncation masks. Hand-worked numbers and numpy references over
padded layouts, eos == pad and all-masked rows."""
import math

import numpy as np
import paddle
import pytest

from alignment.config.registry import KL_ESTIMATORS, POLICY_LOSSES
from alignment.ppo.rl_math import algorithms as alg
from alignment.ppo.rl_math import surrogate as sur
from alignment.ppo.rl_math.kl import kl_estimate
from tests.golden import INF, close, ppo_case, response_mask, t


# ---------------------------------------------------------------- loss aggregation (verl loss_agg_mode)
AGG_MODES = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm")


def ref_aggregate(loss, mask, mode, constant=None):
    """Definition over the rows with at least one valid token; 0 when there are none."""
    rows = [np.asarray(loss[b], np.float64)[np.asarray(mask[b]) > 0] for b in range(len(loss))]
    rows = [r for r in rows if len(r)]
    if not rows:
        return 0.0
    if mode == "token-mean":
        return np.concatenate(rows).mean()
    if mode == "seq-mean-token-mean":
        per_row = [r.mean() for r in rows]
    else:
        per_row = [r.sum() / (constant if mode == "seq-mean-token-sum-norm" else 1.0) for r in rows]
    return float(np.mean(per_row))


def test_aggregate_loss_hand_values_all_masked_and_errors():
    # row 0 right-padded [1, 2], row 1 left-padded [6], row 2 all-masked; inf / NaN garbage outside the mask
    x = t([[1.0, 2, INF], [-INF, np.nan, 6], [np.nan, 8, 9]])
    mask = t([[1.0, 1, 0], [0, 0, 1], [0, 0, 0]])
    close(sur.aggregate_loss(x, mask, "token-mean"), 3.0)  # (1 + 2 + 6) / 3
    close(sur.aggregate_loss(x, mask, "seq-mean-token-mean"), 3.75)  # (1.5 + 6) / 2, the empty row not counted
    close(sur.aggregate_loss(x, mask, "seq-mean-token-sum"), 4.5)  # (3 + 6) / 2
    close(sur.aggregate_loss(x, mask, "seq-mean-token-sum-norm", 3), 1.5)  # (3 / 3 + 6 / 3) / 2
    close(sur.aggregate_loss(x, mask.astype("bool"), "seq-mean-token-mean"), 3.75)  # bool masks too
    for mode in AGG_MODES:
        out = sur.aggregate_loss(x, t(np.zeros((3, 3))), mode, 3)
        assert out.dtype == paddle.float32 and out.shape == []
        close(out, 0.0)  # all-masked batch: 0, not NaN
    with pytest.raises(ValueError, match="seq-mean"):
        sur.aggregate_loss(x, mask, "sequence-mean")
    for bad in (None, 0):
        with pytest.raises(ValueError, match="positive constant"):
            sur.aggregate_loss(x, mask, "seq-mean-token-sum-norm", bad)


def test_aggregate_loss_gradients_weight_tokens_as_documented():
    # rows of 2 and 1 valid tokens + an all-masked row; d loss / d l_it:
    # token-mean 1/3 each | seq-mean-token-mean 1/(2 * len_i): 1/4, 1/2 | token-sum 1/2 | token-sum-norm 1/(2 * 4)
    mask = [[1.0, 1, 0], [0, 0, 1], [0, 0, 0]]
    want = {"token-mean": [[1 / 3, 1 / 3, 0], [0, 0, 1 / 3]], "seq-mean-token-mean": [[0.25, 0.25, 0], [0, 0, 0.5]],
            "seq-mean-token-sum": [[0.5, 0.5, 0], [0, 0, 0.5]], "seq-mean-token-sum-norm": [[1 / 8, 1 / 8, 0],
                                                                                            [0, 0, 1 / 8]]}
    for mode in AGG_MODES:
        x = t([[1.0, 2, 3], [4, 5, 6], [7, 8, INF]])
        x.stop_gradient = False
        sur.aggregate_loss(x, t(mask), mode, 4).backward()
        close(x.grad, want[mode] + [[0, 0, 0]])


def test_aggregate_loss_numpy_reference_over_layouts():
    # right padding, left padding, mid-row, truncated (full width) and all-masked rows
    mask = np.array(response_mask([0, 3, 1, 0, 2], [4, 5, 3, 8, 0], 8), dtype="float32")
    rng = np.random.default_rng(7)
    loss = rng.normal(size=(5, 8))
    garbage = np.where(mask > 0, loss, np.nan)
    for mode in AGG_MODES:
        close(sur.aggregate_loss(t(garbage), t(mask), mode, 8), ref_aggregate(loss, mask, mode, 8), 1e-5)
    # the modes really differ on uneven lengths (token-mean weighs the long row more)
    means = [sur.aggregate_loss(t(loss), t(mask), m, 8).item() for m in AGG_MODES]
    assert len({round(v, 4) for v in means}) == 4


# ---------------------------------------------------------------- clip-higher (asymmetric clipping)
def ppo_loss(lp, old, adv, mask, low, high, mode="token-mean", split=True):
    """The registered token-ratio policy loss (policy_loss_mode 'ppo'), clipped to [1 - low, 1 + high]."""
    return POLICY_LOSSES["ppo"]()(lp, old, adv, mask, low, high, mode, None, split)


def gspo_loss(lp, old, adv, mask, low, high):
    """The registered sequence-ratio policy loss (policy_loss_mode 'gspo')."""
    return POLICY_LOSSES["gspo"]()(lp, old, adv, mask, low, high, "seq-mean-token-mean", None, True)


def test_asymmetric_clip_hand_worked_stats_and_gradients():
    lp, old, adv, mask = ppo_case()
    # low 0.2, high 0.4 -> rho clipped to [0.8, 1.4]:
    # (1.5, +1): max(-1.5, -1.4) = -1.4 clipped | (0.5, +1): -0.5 | (0.5, -1): max(0.5, 0.8) = 0.8 clipped
    # (1.5, -1): max(1.5, 1.4) = 1.5 | (1.1, +2): -2.2   -> (-1.4 - 0.5 + 0.8 + 1.5 - 2.2) / 5 = -0.36
    loss, stats = ppo_loss(lp, old, adv, mask, 0.2, 0.4)
    close(loss, -0.36)
    close(stats["clip_frac_low"], 0.4)  # rho = 0.5 twice < 0.8
    close(stats["clip_frac_high"], 0.4)  # rho = 1.5 twice > 1.4
    close(stats["clip_frac"], 0.8)
    close(stats["ratio"], (1.5 + 0.5 + 0.5 + 1.5 + 1.1) / 5)
    assert all(v.stop_gradient for v in stats.values())
    loss.backward()
    # unclipped tokens: -A rho / 5 -> (0.5, +1): -0.1, (1.5, -1): 0.3, (1.1, +2): -0.44; clipped and masked: 0
    close(lp.grad, [[0, -0.1, 0, 0.3, -0.44, 0]])
    # low 0.2, high 0.6 -> [0.8, 1.6]: (1.5, +1) no longer clipped: (-1.5 - 0.5 + 0.8 + 1.5 - 2.2) / 5 = -0.38
    loss, stats = ppo_loss(lp, old, adv, mask, 0.2, 0.6)
    close(loss, -0.38)
    close(stats["clip_frac_high"], 0.0)


def test_asymmetric_clip_symmetric_equals_policy_loss_and_reference():
    lp, old, adv, mask = ppo_case()
    loss, stats = ppo_loss(lp, old, adv, mask, 0.2, 0.2)
    ref_loss, ref_stats = ppo_loss(lp, old, adv, mask, 0.2, 0.2, split=False)
    close(loss, ref_loss.numpy())
    for key in ("clip_frac", "approx_kl", "ratio"):
        close(stats[key], ref_stats[key].numpy())
    # numpy reference, GRPO aggregation, over right / left / mid-row / truncated / all-masked rows (inf there)
    rng = np.random.default_rng(8)
    m = np.array(response_mask([0, 2, 1, 0, 3], [3, 4, 2, 6, 0], 6), dtype="float32")
    old = rng.normal(size=(5, 6)) - 2
    new = old + rng.normal(size=(5, 6)) * 0.3
    a = rng.normal(size=(5, 6))
    rho = np.exp(new - old)
    per_tok = np.maximum(-a * rho, -a * np.clip(rho, 0.9, 1.25))
    lp = t(np.where(m > 0, new, INF))
    lp.stop_gradient = False
    loss, stats = ppo_loss(lp, t(old), t(a), t(m), 0.1, 0.25, "seq-mean-token-mean")
    close(loss, ref_aggregate(per_tok, m, "seq-mean-token-mean"), 1e-5)
    close(stats["clip_frac_low"], ((rho < 0.9) * m).sum() / m.sum())
    close(stats["clip_frac_high"], ((rho > 1.25) * m).sum() / m.sum())
    loss.backward()
    assert np.isfinite(lp.grad.numpy()).all() and (lp.grad.numpy()[m == 0] == 0).all()


# ---------------------------------------------------------------- GSPO
def _gspo_case():
    # row 0 right-padded, log rho = [ln 2, 0]       -> s = exp(ln 2 / 2) = sqrt 2, A = +1
    # row 1 left-padded,  log rho = 3 x ln 0.5      -> s = 0.5,                   A = +1
    # row 2 all-masked (log p = inf there),                                        A = 100
    # row 3 mid-row,      log rho = [.1, -.1, .3, .1] -> s = e^0.1,                A = -1
    mask = np.array([[1, 1, 0, 0, 0], [0, 0, 1, 1, 1], [0, 0, 0, 0, 0], [0, 1, 1, 1, 1]], dtype="float32")
    log_rho = np.array([[math.log(2), 0, 0, 0, 0], [0, 0] + [math.log(0.5)] * 3, [0] * 5, [0, .1, -.1, .3, .1]])
    old = -1.0 - np.arange(20).reshape(4, 5) / 10
    lp = t(np.where(mask > 0, old + log_rho, INF))
    lp.stop_gradient = False
    adv = np.array([[1.0] * 5, [1.0] * 5, [100.0] * 5, [-1.0] * 5]) * mask
    return lp, t(old), t(adv), t(mask), log_rho


def test_gspo_hand_worked_loss_gradients_and_stats():
    lp, old, adv, mask, log_rho = _gspo_case()
    # clip to [0.8, 1.28]: row 0: max(-sqrt 2, -1.28) = -1.28 clipped | row 1: max(-0.5, -0.8) = -0.5
    # row 3: max(e^.1, e^.1) = e^.1 | loss = (-1.28 - 0.5 + e^0.1) / 3 (the all-masked row is not counted)
    loss, stats = gspo_loss(lp, old, adv, mask, 0.2, 0.28)
    e1 = math.exp(0.1)
    close(loss, (-1.28 - 0.5 + e1) / 3)
    loss.backward()
    # d loss / d log p_t = -A s_i / (3 rows * len_i) on unclipped rows: row 1 -0.5 / 9, row 3 e^.1 / 12; row 0
    # clipped as a whole (a token-level PPO would still push its rho = 1 token), masked tokens 0
    close(lp.grad, [[0] * 5, [0, 0] + [-0.5 / 9] * 3, [0] * 5, [0] + [e1 / 12] * 4])
    seq = [math.sqrt(2), 0.5, e1]
    close(stats["clip_frac_low"], 1 / 3)
    close(stats["clip_frac_high"], 1 / 3)
    close(stats["clip_frac"], 2 / 3)
    close(stats["ratio"], sum(seq) / 3)
    rho = np.exp(log_rho[mask.numpy() > 0])
    close(stats["approx_kl"], (rho - 1 - np.log(rho)).mean())
    assert all(v.stop_gradient for v in stats.values())


def test_gspo_clamps_the_log_ratio_at_10_like_verl():
    # log s = 12 > 10 -> s = e^10; A = -1: max(e^10, 1.28) = e^10, and the clamped ratio passes no gradient
    lp = t([[12.0]])
    lp.stop_gradient = False
    loss, _ = gspo_loss(lp, t([[0.0]]), t([[-1.0]]), t([[1.0]]), 0.2, 0.28)
    close(loss, math.exp(10), 1e-2)
    loss.backward()
    close(lp.grad, [[0.0]])


def test_gspo_numpy_reference_with_token_advantages():
    rng = np.random.default_rng(9)
    m = np.array(response_mask([0, 2, 1, 0, 4], [3, 4, 2, 6, 0], 6), dtype="float32")
    old = rng.normal(size=(5, 6)) - 2
    new = old + rng.normal(size=(5, 6)) * 0.4
    a = rng.normal(size=(5, 6))  # token-level advantages (GSPO-token)
    lp = t(np.where(m > 0, new, INF))
    lp.stop_gradient = False
    loss, stats = gspo_loss(lp, t(old), t(a), t(m), 0.1, 0.15)
    n = m.sum(1)
    s = np.exp(np.where(n > 0, ((new - old) * m).sum(1) / np.maximum(n, 1), 0.0))[:, None] * np.ones((1, 6))
    per_tok = np.maximum(-a * s, -a * np.clip(s, 0.9, 1.15))
    close(loss, ref_aggregate(per_tok, m, "seq-mean-token-mean"), 1e-5)
    clipped = ((a > 0) & (s > 1.15)) | ((a < 0) & (s < 0.9))
    grad = np.where(clipped, 0.0, -a * s) * m / np.maximum(n, 1)[:, None] / (n > 0).sum()
    assert clipped[m > 0].any() and (~clipped[m > 0]).any()  # both branches exercised
    loss.backward()
    close(lp.grad, grad, 1e-6)
    seq = s[n > 0, 0]
    close(stats["clip_frac"], ((seq < 0.9) | (seq > 1.15)).mean())


# ---------------------------------------------------------------- entropy bonus
def test_entropy_bonus_hand_worked_and_gradient():
    # entropies: row 0 [ln 2, ln 4] (right-padded), row 1 [ln 3] (left-padded), row 2 all-masked; coeff 0.1
    # token-mean: (ln 2 + ln 4 + ln 3) / 3 = ln 24 / 3 | seq-mean-token-mean: ((ln 2 + ln 4) / 2 + ln 3) / 2
    ent = t([[math.log(2), math.log(4), INF], [np.nan, 9, math.log(3)], [1, 1, 1]])
    ent.stop_gradient = False
    mask = t([[1.0, 1, 0], [0, 0, 1], [0, 0, 0]])
    loss, h = sur.entropy_bonus_loss(t(0.5), ent, mask, 0.1)
    close(h, math.log(24) / 3)
    close(loss, 0.5 - 0.1 * math.log(24) / 3)
    assert h.stop_gradient
    loss.backward()
    close(ent.grad, [[-0.1 / 3, -0.1 / 3, 0], [0, 0, -0.1 / 3], [0, 0, 0]])  # more entropy lowers the loss
    loss, h = sur.entropy_bonus_loss(t(0.5), ent, mask, 0.1, "seq-mean-token-mean")
    close(h, (1.5 * math.log(2) + math.log(3)) / 2)
    close(loss, 0.5 - 0.1 * (1.5 * math.log(2) + math.log(3)) / 2)
    loss, h = sur.entropy_bonus_loss(t(0.5), ent, t(np.zeros((3, 3))), 0.1)
    close(loss, 0.5)  # all-masked: no bonus, no NaN


# ---------------------------------------------------------------- KL as a loss term
def test_kl_loss_estimates_hand_values_and_gradients():
    # p = 0.5, q = 0.25: k1 = ln 2, k2 = (ln 2)^2 / 2, k3 = q/p - ln(q/p) - 1 = ln 2 - 0.5
    # d/d log p: k1 1, k2 ln 2, k3 1 - q/p = 0.5; "+" variants: the value of their base, the gradient of k2
    ln2 = math.log(2)
    want = {"k1": (ln2, 1.0), "k2": (0.5 * ln2 ** 2, ln2), "k3": (ln2 - 0.5, 0.5), "low_var_kl": (ln2 - 0.5, 0.5),
            "k1+": (ln2, ln2), "k3+": (ln2 - 0.5, ln2), "low_var_kl+": (ln2 - 0.5, ln2)}
    for est, (value, grad) in want.items():
        lp = t([[math.log(0.5)]])
        lp.stop_gradient = False
        kl = kl_estimate(est)(lp, t([[math.log(0.25)]]))
        close(kl, [[value]])
        kl.sum().backward()
        close(lp.grad, [[grad]])
    with pytest.raises(ValueError, match="'kl_loss_estimator' must be one of .*'low_var_kl\+'.*got 'k4'"):
        KL_ESTIMATORS.check("kl_loss_estimator", "k4")


def test_low_var_kl_clamps_like_verl():
    # log q - log p = 25 -> clamped to 20: e^20 - 21 -> clamped to 10; = -25 -> -20: e^-20 + 19 -> 10; = 2 kept
    lp = t([[0.0, 25.0, 0.0]])
    lp.stop_gradient = False
    ref = t([[25.0, 0.0, 2.0]])
    kl = kl_estimate("low_var_kl")(lp, ref)
    close(kl, [[10.0, 10.0, math.exp(2) - 3]])
    close(kl_estimate("k3")(lp, ref)[0, 1:], [24 + math.exp(-25), math.exp(2) - 3], 1e-4)  # k3 unclamped
    kl.sum().backward()
    close(lp.grad, [[0, 0, 1 - math.exp(2)]], 1e-4)  # clamped entries pass no gradient


def test_kl_loss_aggregated_over_layouts_reference():
    rng = np.random.default_rng(10)
    m = np.array(response_mask([0, 2, 1, 0, 3], [3, 4, 2, 6, 0], 6), dtype="float32")
    p, q = rng.normal(size=(5, 6)) - 2, rng.normal(size=(5, 6)) - 2
    d = q - p
    k3 = np.exp(d) - d - 1
    for mode in ("token-mean", "seq-mean-token-mean"):
        lp = t(np.where(m > 0, p, INF))  # garbage outside the mask: inf - inf = NaN there
        lp.stop_gradient = False
        loss = sur.kl_loss(lp, t(np.where(m > 0, q, INF)), t(m), kl_estimate("k3"), mode)
        close(loss, ref_aggregate(k3, m, mode), 1e-5)
        loss.backward()
        g = lp.grad.numpy()
        assert np.isfinite(g).all() and (g[m == 0] == 0).all() and (g[m > 0] != 0).all()
    close(sur.kl_loss(t(p), t(q), t(m), kl_estimate("k1")), ref_aggregate(p - q, m, "token-mean"), 1e-5)
    close(sur.kl_loss(t(p), t(q), t(np.zeros((5, 6))), kl_estimate("low_var_kl")), 0.0)


# ---------------------------------------------------------------- DAPO: dynamic sampling, overlong, truncation
def test_dynamic_sampling_group_filter():
    from alignment.ppo.rl_math import dapo
    # groups of 3: all 1 (drop) | 0, 1, 0 (keep) | 0.1 x 3 (drop) | 0.5, 0.501, 0.5: population std 0.000471 (keep
    # at tol 0, drop at tol 1e-3)
    r = [1.0, 1, 1, 0, 1, 0, 0.1, 0.1, 0.1, 0.5, 0.501, 0.5]
    close(dapo.groups_with_reward_spread(r, 3).astype("float32"), [0, 1, 0, 1])
    close(dapo.groups_with_reward_spread(t(r), 3, tol=1e-3).astype("float32"), [0, 1, 0, 0])
    close(dapo.groups_with_reward_spread(t(r), 3, tol=4e-4).astype("float32"), [0, 1, 0, 1])
    # seven float32 0.1s: a naive (r - mean) std is 7.5e-9 > 0; equal rewards must still count as equal
    assert not dapo.groups_with_reward_spread(t([0.1] * 7 + [0.0] * 7), 7).numpy().any()
    keep = dapo.groups_with_reward_spread(r, 3)
    close(dapo.rows_of_groups(keep, 3), [3, 4, 5, 9, 10, 11])
    assert dapo.rows_of_groups(dapo.groups_with_reward_spread([2.0] * 6, 3), 3).shape == [0]  # all dropped
    assert dapo.groups_with_reward_spread([1.0, 1, 2], 1).numpy().all()  # size 1: kept, as in verl
    with pytest.raises(ValueError, match="num_return_sequences=4"):
        dapo.groups_with_reward_spread(r[:10], 4)  # 10 rewards are not whole groups of 4


def test_overlong_penalty_hand_values_verl_reference_and_errors():
    from alignment.ppo.rl_math import dapo
    # max 16, buffer 4: 0 up to 12, then -(L - 12) / 4 * factor, -factor at 16 and beyond
    close(dapo.overlong_penalty([0, 12, 13, 14, 16, 20], 16, 4, 1.0), [0, 0, -0.25, -0.5, -1, -1])
    close(dapo.overlong_penalty(t([13, 16], "int64"), 16, 4, 0.5), [-0.125, -0.5])
    lengths = np.arange(0, 513)
    verl = np.minimum(-(lengths - (512 - 100)) / 100 * 1.0, 0)  # verl DAPORewardManager, L <= max_resp_len
    close(dapo.overlong_penalty(lengths, 512, 100, 1.0), verl)
    for buffer in (0, 17):
        with pytest.raises(ValueError, match="overlong_buffer_len"):
            dapo.overlong_penalty([1], 16, buffer, 1.0)


def test_truncation_and_overlong_with_eos_equal_to_pad():
    from alignment.ppo.rl_math import dapo
    pad = eos = 0
    # max_resp_len 4; rows: full length ending with eos (== pad) | full length cut off | short, ended |
    # left-padded full length cut off | all-masked (empty response)
    ids = np.array([[5, 6, 7, eos, pad], [5, 6, 7, 8, pad], [5, eos, pad, pad, pad], [pad, 5, 6, 7, 9],
                    [pad] * 5])
    mask = t(response_mask([0, 0, 0, 1, 0], [4, 4, 2, 4, 0], 5))
    lengths = mask.sum(axis=1)  # from the mask: 4, 4, 2, 4, 0 (ids != pad would say 3 for row 0)
    last = alg.last_valid_index(mask)
    ends_with_eos = (paddle.take_along_axis(t(ids, "int64"), last.clip(min=0).unsqueeze(1), axis=1).squeeze(1)
                     == eos) & (last >= 0)
    truncated = dapo.truncated_responses(lengths, 4, ends_with_eos)
    close(truncated.astype("float32"), [0, 1, 0, 1, 0])
    close(dapo.overlong_penalty(lengths, 4, 2, 1.0), [-1, -1, 0, -1, 0])  # eos counts: row 0 is at the max
    kept = dapo.mask_truncated_responses(mask, truncated)
    assert kept.dtype == paddle.float32
    close(kept, np.array(response_mask([0, 0, 0, 1, 0], [4, 0, 2, 0, 0], 5)))
    # truncated rows leave the loss: the token mean is over rows 0 and 2 only, and stays finite
    loss = t(np.arange(25).reshape(5, 5))
    close(sur.aggregate_loss(loss, kept, "token-mean"), (0 + 1 + 2 + 3 + 10 + 11) / 6)
    close(sur.aggregate_loss(loss, kept, "seq-mean-token-mean"), (1.5 + 10.5) / 2)
    close(dapo.mask_truncated_responses(mask, [True] * 5), np.zeros((5, 5)))
