"""Golden tests of alignment/ppo/rl_math/algorithms.py: hand-worked numbers (arithmetic in comments) and tiny
independent numpy / pure-Python references, over right / left / mid-row padding, eos == pad, truncation,
all-masked rows and group size 1."""
import math

import numpy as np
import paddle
import paddle.nn.functional as F
import pytest

from alignment.config.registry import ADVANTAGE_ESTIMATORS, POLICY_LOSSES
from alignment.models import logprobs as lp
from alignment.ppo.rl_math import algorithms as alg
from alignment.ppo.rl_math.distill import log_softmax
from alignment.ppo.rl_math.kl import kl_estimate
from tests.golden import INF, close, ppo_case, response_mask, t


# ---------------------------------------------------------------- references (plain Python / numpy)
def ref_gae_row(values, rewards, mask, gamma, lam):
    """Definition: A_t = sum_l (gamma lam)^l delta_{t+l} over the valid tokens only, V after the last = 0."""
    idx = [i for i, m in enumerate(mask) if m]
    v = [values[i] for i in idx] + [0.0]
    r = [rewards[i] for i in idx]
    deltas = [r[k] + gamma * v[k + 1] - v[k] for k in range(len(r))]
    adv = [0.0] * len(mask)
    for k, i in enumerate(idx):
        adv[i] = sum((gamma * lam) ** l * deltas[k + l] for l in range(len(r) - k))
    ret = [adv[i] + (values[i] if mask[i] else 0.0) for i in range(len(mask))]
    return adv, ret


def ref_whiten(x, mask):
    x, mask = np.asarray(x, np.float64), np.asarray(mask) > 0
    vals = x[mask]
    out = np.zeros_like(x)
    out[mask] = (vals - vals.mean()) / np.sqrt(vals.var(ddof=1) + 1e-8)
    return out


# ---------------------------------------------------------------- log probs / entropy
def test_gather_log_probs_hand_case_and_log_softmax_reference():
    # logits = log [1, 2, 3] -> softmax = [1/6, 2/6, 3/6]
    logits = t(np.log([[[1.0, 2.0, 3.0], [1.0, 2.0, 3.0]]]))  # [1, 2, 3]
    close(lp.gather_log_probs(logits, t([[2, 0]], "int64")), [[math.log(0.5), math.log(1 / 6)]])
    rng = np.random.default_rng(0)
    logits = t(rng.normal(size=(3, 5, 11)) * 3)
    labels = t(rng.integers(0, 11, size=(3, 5)), "int64")
    out = lp.gather_log_probs(logits, labels)
    ref = paddle.take_along_axis(F.log_softmax(logits, axis=-1), labels.unsqueeze(-1), axis=-1).squeeze(-1)
    assert out.shape == [3, 5] and out.dtype == paddle.float32
    np.testing.assert_allclose(out.numpy(), ref.numpy(), atol=1e-6)


def test_gather_log_probs_gradient_is_onehot_minus_softmax():
    logits = t(np.log([[[1.0, 2.0, 3.0]]]))
    logits.stop_gradient = False
    lp.gather_log_probs(logits, t([[2]], "int64")).sum().backward()
    close(logits.grad, [[[-1 / 6, -2 / 6, 1 - 3 / 6]]])


def test_entropy_from_logits():
    # uniform over 4 -> ln 4; probs [1/6, 1/3, 1/2] -> -(1/6 ln 1/6 + 1/3 ln 1/3 + 1/2 ln 1/2)
    h = -(1 / 6 * math.log(1 / 6) + 1 / 3 * math.log(1 / 3) + 1 / 2 * math.log(1 / 2))
    close(lp.entropy_from_logits(t([[[0.0, 0, 0, 0]]])), [[math.log(4)]])
    close(lp.entropy_from_logits(t(np.log([[[1.0, 2.0, 3.0]]]))), [[h]])
    rng = np.random.default_rng(1)
    z = rng.normal(size=(2, 3, 7)) * 2
    p = np.exp(z - z.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    close(lp.entropy_from_logits(t(z)), -(p * np.log(p)).sum(-1))
    # large logits stay finite: one certain token -> 0; two tied far above the rest -> ln 2
    close(lp.entropy_from_logits(t([[[1000.0, 0.0, -1000.0], [500.0, 500.0, -500.0]]])), [[0.0, math.log(2)]])


def test_log_softmax_by_hand_large_logits_masked_entries_and_its_gradient():
    # probs [1/6, 1/3, 1/2]; logits near 1000 and a -inf (a filtered token) stay exact
    close(log_softmax(t(np.log([[1.0, 2.0, 3.0]]))), np.log([[1 / 6, 2 / 6, 3 / 6]]))
    close(log_softmax(t([[1000.0, 1000.0, -INF]])), [[-math.log(2), -math.log(2), -INF]])
    rng = np.random.default_rng(2)
    z = rng.normal(size=(2, 3, 11)) * 3
    shifted = z - z.max(-1, keepdims=True)
    close(log_softmax(t(z)), shifted - np.log(np.exp(shifted).sum(-1, keepdims=True)))
    # the gradient of sum(w * log_softmax(z)) is w - softmax(z) * sum(w): against F.log_softmax's
    mine, theirs = t(z), t(z)
    mine.stop_gradient = theirs.stop_gradient = False
    w = t(rng.normal(size=z.shape))
    (w * log_softmax(mine)).sum().backward()
    (w * F.log_softmax(theirs, axis=-1)).sum().backward()
    close(mine.grad, theirs.grad.numpy())


def test_entropy_stays_accurate_for_large_logits_over_a_large_vocabulary():
    # SmolLM2-like: 49152 entries with logits around 40. Summing p * z uncentred in float32 was off by 1.1e-3 here
    # (and by 4.5e-3 on real SmolLM2 logits); centred on the max it is within 1.2e-4 of float64.
    rng = np.random.default_rng(3)
    z = (40 + 4 * rng.standard_normal((4, 49152))).astype(np.float32)
    shifted = z.astype(np.float64) - z.max(-1, keepdims=True)
    log_p = shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))
    close(lp.entropy_from_logits(t(z)), -(np.exp(log_p) * log_p).sum(-1), atol=3e-4)


def test_log_probs_and_entropy_from_the_kernels_softmax():
    """One softmax for both: the log-probs are gather_log_probs' bit for bit (values and gradient), the entropy
    is the definition's, detached, for hand cases, large logits and a SmolLM2-sized vocabulary."""
    h = -(1 / 6 * math.log(1 / 6) + 1 / 3 * math.log(1 / 3) + 1 / 2 * math.log(1 / 2))
    logits = t([[[0.0, 0, 0, 0], [math.log(1.0), math.log(2.0), math.log(3.0), -1e4]]])  # [1, 2, 4]; e^-1e4 = 0
    log_probs, entropy = lp.log_probs_and_entropy(logits, t([[1, 2]], "int64"))
    close(log_probs, [[math.log(1 / 4), math.log(1 / 2)]])
    close(entropy, [[math.log(4), h]])
    # one certain token -> 0, whatever the label (the kernel clips log p(label) at -64, here of -2000); two tied far
    # above the rest -> ln 2
    big = t([[[1000.0, 0.0, -1000.0], [1000.0, 0.0, -1000.0], [500.0, 500.0, -500.0]]])
    log_probs, entropy = lp.log_probs_and_entropy(big, t([[0, 2, 1]], "int64"))
    close(log_probs, [[0.0, -64.0, math.log(0.5)]])
    close(entropy, [[0.0, 0.0, math.log(2)]])

    rng = np.random.default_rng(4)
    z = t(rng.normal(size=(3, 5, 11)) * 3)
    z.stop_gradient = False
    labels = t(rng.integers(0, 11, size=(3, 5)), "int64")
    log_probs, entropy = lp.log_probs_and_entropy(z, labels)
    assert entropy.stop_gradient and not log_probs.stop_gradient
    log_probs.sum().backward()
    grad = z.grad.numpy().copy()
    z.clear_gradient()
    reference = lp.gather_log_probs(z, labels)
    reference.sum().backward()
    assert np.array_equal(log_probs.numpy(), reference.numpy()) and np.array_equal(grad, z.grad.numpy())
    close(entropy, lp.entropy_from_logits(z.detach()), atol=1e-5)

    z = (40 + 4 * rng.standard_normal((2, 2, 49152))).astype(np.float32)
    labels = rng.integers(0, 49152, size=(2, 2))
    shifted = z.astype(np.float64) - z.max(-1, keepdims=True)
    log_p = shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))
    _, entropy = lp.log_probs_and_entropy(t(z), t(labels, "int64"))
    close(entropy, -(np.exp(log_p) * log_p).sum(-1), atol=1e-4)


# ---------------------------------------------------------------- KL estimators
def test_kl_estimators_hand_values():
    # p = 0.5, q = 0.25: k1 = ln 2; k2 = (ln 2)^2 / 2; k3 = q/p - ln(q/p) - 1 = 0.5 + ln 2 - 1
    lp, ref = t([[math.log(0.5)]]), t([[math.log(0.25)]])
    ln2 = math.log(2)
    close(kl_estimate("k1")(lp, ref), [[ln2]])
    close(kl_estimate("k2")(lp, ref), [[0.5 * ln2 ** 2]])
    close(kl_estimate("k3")(lp, ref), [[0.5 + ln2 - 1]])
    # reversed (p < q): k1 negative, k3 = 2 - ln 2 - 1
    close(kl_estimate("k1")(ref, lp), [[-ln2]])
    close(kl_estimate("k3")(ref, lp), [[2 - ln2 - 1]])


def test_kl_k3_nonnegative_and_zero_at_equality():
    rng = np.random.default_rng(2)
    a, b = t(rng.normal(size=(4, 9)) * 3), t(rng.normal(size=(4, 9)) * 3)
    k3 = kl_estimate("k3")(a, b).numpy()
    d = b.numpy() - a.numpy()
    close(k3, np.exp(d) - d - 1, atol=1e-4)
    assert (k3 >= 0).all() and (kl_estimate("k2")(a, b).numpy() >= 0).all()
    close(kl_estimate("k3")(a, a), np.zeros((4, 9)))


# ---------------------------------------------------------------- masked statistics
def test_masked_mean_sum_hand_values_and_all_masked():
    x = t([[1.0, 2, 3], [4, 5, 6], [7, 8, 9]])
    mask = t([[1.0, 1, 0], [0, 0, 1], [0, 0, 0]])
    close(alg.masked_sum(x, mask), 9.0)  # 1 + 2 + 6
    close(alg.masked_mean(x, mask), 3.0)  # 9 / 3
    close(alg.masked_mean(x, mask, axis=1), [1.5, 6.0, 0.0])  # all-masked row -> 0, not NaN
    close(alg.masked_mean(x, t(np.zeros((3, 3)))), 0.0)
    garbage = t([[1.0, 2, INF], [-INF, np.nan, 6], [np.nan, 1, 1]])  # inf / NaN outside the mask are ignored
    close(alg.masked_mean(garbage, mask), 3.0)


def test_masked_whiten_hand_values_reference_and_edges():
    # masked [1, 2, 3]: mean 2, unbiased var (1 + 0 + 1) / 2 = 1 -> [-1, 0, 1]; padded slot -> 0
    x, mask = t([[1.0, 2, 3, 100]]), t([[1.0, 1, 1, 0]])
    close(alg.masked_whiten(x, mask), [[-1, 0, 1, 0]])
    close(alg.masked_whiten(x, mask, shift_mean=False), [[1, 2, 3, 0]])  # (x - 2)/1 + 2
    rng = np.random.default_rng(3)
    xs, ms = rng.normal(size=(3, 6)) * 4 + 2, (rng.random((3, 6)) > 0.4).astype("float32")
    close(alg.masked_whiten(t(xs), t(ms)), ref_whiten(xs, ms), atol=1e-4)
    zero = alg.masked_whiten(x, t([[0.0, 0, 0, 0]]))  # all-masked: zeros, no NaN
    close(zero, [[0, 0, 0, 0]])
    close(alg.masked_whiten(t([[5.0, 5, 5]]), t([[1.0, 1, 1]])), [[0, 0, 0]])  # constant -> 0



def test_masked_whiten_over_data_ranks_uses_the_whole_batch():
    """reduce_sum doubling every partial sum = a second rank holding the same rows: the statistics must be
    those of the 2B-row batch (unbiased variance over 2n - 1), with left/right padding and an all-masked row."""
    x = t([[1.0, 2, 3, 100], [9, 4, 5, 6], [7, 7, 7, 7]])
    mask = t([[1.0, 1, 1, 0], [0, 1, 1, 1], [0, 0, 0, 0]])  # right-padded, left-padded, all-masked
    doubled = alg.masked_whiten(x, mask, reduce_sum=lambda v: v * 2)
    whole = alg.masked_whiten(paddle.concat([x, x]), paddle.concat([mask, mask]))[:3]
    close(doubled, whole.numpy())
    # by hand: values [1, 2, 3, 4, 5, 6] twice -> mean 3.5, sum of squares 2 * 17.5 = 35, var 35 / 11
    s = math.sqrt(35 / 11 + 1e-8)
    close(doubled, [[-2.5 / s, -1.5 / s, -0.5 / s, 0], [0, 0.5 / s, 1.5 / s, 2.5 / s], [0, 0, 0, 0]])
    close(alg.masked_whiten(x, mask, reduce_sum=lambda v: v), alg.masked_whiten(x, mask).numpy())  # one rank


# ---------------------------------------------------------------- GAE
def test_gae_hand_worked():
    # gamma = lam = 1, V = [1, 2, 3], r = [0, 0, 1]:
    # d2 = 1 - 3 = -2, A2 = -2; d1 = 0 + 3 - 2 = 1, A1 = 1 - 2 = -1; d0 = 0 + 2 - 1 = 1, A0 = 1 - 1 = 0
    # returns = A + V = [1, 1, 1] (Monte Carlo return of the final reward 1)
    adv, ret = alg.compute_gae(t([[1.0, 2, 3]]), t([[0.0, 0, 1]]), t([[1.0, 1, 1]]), 1.0, 1.0)
    close(adv, [[0, -1, -2]])
    close(ret, [[1, 1, 1]])
    # gamma = 0.9, lam = 0.5, V = [0.5, 1], r = [0.2, 2]:
    # d1 = 2 - 1 = 1, A1 = 1; d0 = 0.2 + 0.9 * 1 - 0.5 = 0.6, A0 = 0.6 + 0.9 * 0.5 * 1 = 1.05; R = [1.55, 2]
    adv, ret = alg.compute_gae(t([[0.5, 1.0]]), t([[0.2, 2.0]]), t([[1.0, 1]]), 0.9, 0.5)
    close(adv, [[1.05, 1.0]])
    close(ret, [[1.55, 2.0]])


def test_gae_layouts_match_compacted_reference():
    # the same 3-token response (V = [0.5, -1, 2], r = [0.1, 0, 1.5]) placed right-padded, left-padded,
    # mid-row (response block of a full sequence), plus a truncated full row and an all-masked row;
    # values/rewards outside the mask are garbage and must not matter
    g = 99.0
    values = [[0.5, -1, 2, g, g, g], [g, g, g, 0.5, -1, 2], [g, g, 0.5, -1, 2, g], [1, 2, 3, 4, 5, 6], [g] * 6]
    rewards = [[0.1, 0, 1.5, g, g, g], [g, g, g, 0.1, 0, 1.5], [g, g, 0.1, 0, 1.5, g], [0, 1, 0, 0, 0, 2], [g] * 6]
    masks = [[1, 1, 1, 0, 0, 0], [0, 0, 0, 1, 1, 1], [0, 0, 1, 1, 1, 0], [1] * 6, [0] * 6]
    adv, ret = alg.compute_gae(t(values), t(rewards), t(masks), 0.95, 0.9)
    for row in range(5):
        ra, rr = ref_gae_row(values[row], rewards[row], masks[row], 0.95, 0.9)
        close(adv[row], ra)
        close(ret[row], rr)
    a = adv.numpy()
    np.testing.assert_allclose(a[0, :3], a[1, 3:], atol=1e-6)  # layout does not change the answer
    np.testing.assert_allclose(a[0, :3], a[2, 2:5], atol=1e-6)
    assert (a[np.asarray(masks) == 0] == 0).all() and np.isfinite(a).all()
    assert (ret.numpy()[4] == 0).all()


def test_sequence_kl_sums_each_response_then_averages_over_rows():
    # k1 per token = lp - ref; row 0: 0.5 + 0 - 1 = -0.5 (3 tokens), row 1: 1.0 (1 token), row 2 all-masked: 0
    # -> (-0.5 + 1.0 + 0) / 3 rows; a token mean would give 0.5 / 4 tokens instead
    lp = t([[-1.0, -2, -3], [-1, -1, -1], [0, 0, 0]])
    ref = t([[-1.5, -2, -2], [-2, INF, INF], [9, 9, 9]])
    mask = t([[1.0, 1, 1], [1, 0, 0], [0, 0, 0]])
    close(alg.sequence_kl(lp, ref, mask, kl_estimate("k1")), 0.5 / 3)


# ---------------------------------------------------------------- end-score placement
def test_last_valid_index():
    mask = t([[1, 1, 0, 0], [0, 1, 1, 0], [1, 1, 1, 1], [0, 0, 0, 0], [0, 0, 0, 1]])
    out = alg.last_valid_index(mask)
    assert out.dtype == paddle.int64
    assert out.numpy().tolist() == [1, 2, 3, -1, 3]


def test_reward_with_kl_hand_worked():
    # k1 kl = lp - ref = [0.5, 0, -1, (masked)]; kl_coeff 0.1 -> [-0.05, 0, 0.1]; score 10 clipped to 5 at t=2
    lp = t([[-1.0, -2, -3, 0], [-1, -1, -1, -1], [-1, -1, -1, -1], [0, 0, 0, 0]])
    ref = t([[-1.5, -2, -2, -50], [-1, -1, -1, -1], [-1, -1, -1, -1], [9, 9, 9, 9]])
    mask = t([[1.0, 1, 1, 0], [0, 1, 1, 0], [1, 1, 1, 1], [0, 0, 0, 0]])
    rewards, kl = alg.reward_with_kl(t([10.0, -7, 0.5, 3]), lp, ref, mask, 0.1, 5.0, kl_estimate("k1"))
    close(kl, [[0.5, 0, -1, 0], [0] * 4, [0] * 4, [0] * 4])
    close(rewards, [[-0.05, 0, 0.1 + 5, 0],  # clipped +5 on the last valid token
                    [0, 0, -5, 0],  # left-padded block: -7 clipped to -5 at t=2
                    [0, 0, 0, 0.5],  # truncated (mask 1 to the end): score on the last column
                    [0, 0, 0, 0]])  # all-masked row: no end reward, no KL
    # k3 estimator on the first token: q/p = e^-0.5 -> e^-0.5 + 0.5 - 1
    _, kl3 = alg.reward_with_kl(t([0.0] * 4), lp, ref, mask, 0.1, 5.0, kl_estimate("k3"))
    close(kl3[0, 0], math.exp(-0.5) - 0.5)


def test_eos_equals_pad_mask_from_lengths_puts_score_on_eos():
    pad = eos = 2
    # prompt [5, 6], response [7, eos], then padding with the same id
    ids = np.array([[5, 6, 7, eos, pad, pad]])
    good = response_mask([2], [2], 6)  # lengths -> [0, 0, 1, 1, 0, 0]
    naive = ((ids != pad) & (np.arange(6) >= 2)).astype("float32")  # drops the eos token: [0, 0, 1, 0, 0, 0]
    assert good == [[0, 0, 1, 1, 0, 0]] and naive.tolist() == [[0, 0, 1, 0, 0, 0]]
    zeros = t(np.zeros((1, 6)))
    rewards, _ = alg.reward_with_kl(t([0.7]), zeros, zeros, t(good), 0.1, 10.0, kl_estimate("k1"))
    close(rewards, [[0, 0, 0, 0.7, 0, 0]])  # end score on the eos token (index 3)
    assert alg.last_valid_index(t(naive)).numpy().tolist() == [2]  # the naive mask would miss it
    adv, ret = alg.compute_gae(zeros, rewards, t(good), 1.0, 1.0)
    close(adv, [[0, 0, 0.7, 0.7, 0, 0]])  # V = 0, gamma = lam = 1: every response token sees the score
    close(ret, [[0, 0, 0.7, 0.7, 0, 0]])


# ---------------------------------------------------------------- PPO losses
def ppo_loss(log_probs, old_log_probs, advantages, mask, eps):
    """Plain PPO's loss and statistics: the registered token-ratio loss, clipped to [1 - eps, 1 + eps]."""
    return POLICY_LOSSES["ppo"]()(log_probs, old_log_probs, advantages, mask, eps, eps, "token-mean", None, False)


def test_actor_loss_clips_hand_worked_and_stats():
    lp, old, adv, mask = ppo_case()
    loss, stats = ppo_loss(lp, old, adv, mask, 0.2)
    close(loss, -0.32)
    close(ppo_loss(lp, old, adv, mask, 10.0)[0], -0.44)  # huge eps: no clipping
    close(stats["clip_frac"], 0.8)  # |rho - 1| > 0.2 for 4 of 5 tokens
    # approx_kl = mean((rho - 1) - ln rho) = (2 (0.5 - ln 1.5) + 2 (-0.5 + ln 2) + (0.1 - ln 1.1)) / 5
    kl = (2 * (0.5 - math.log(1.5)) + 2 * (-0.5 + math.log(2)) + (0.1 - math.log(1.1))) / 5
    close(stats["approx_kl"], kl)
    assert all(v.stop_gradient for v in stats.values())


def test_actor_loss_gradients():
    # d loss / d log p = -A rho / 5 on unclipped tokens, 0 on clipped and masked ones
    lp, old, adv, mask = ppo_case()
    ppo_loss(lp, old, adv, mask, 0.2)[0].backward()
    close(lp.grad, [[0, -0.5 / 5, 0, 1.5 / 5, -2.2 / 5, 0]])
    # near-on-policy random case: finite, non-zero where mask = 1, zero where 0 (incl. all-masked row, inf there)
    rng = np.random.default_rng(4)
    old = rng.normal(size=(3, 5)) - 2
    m = np.array([[1, 1, 1, 0, 0], [0, 0, 1, 1, 1], [0, 0, 0, 0, 0]], dtype="float32")
    lp = t(np.where(m > 0, old + rng.normal(size=(3, 5)) * 0.01, INF))
    lp.stop_gradient = False
    loss, _ = ppo_loss(lp, t(old), t(rng.normal(size=(3, 5)) + 0.5), t(m), 0.2)
    loss.backward()
    g = lp.grad.numpy()
    assert np.isfinite(loss.numpy()) and np.isfinite(g).all()
    assert (g[m > 0] != 0).all() and (g[m == 0] == 0).all()


def test_critic_loss_hand_worked():
    # eps = 0.2
    # t0: V=1, Vold=0.5, R=1: (V-R)^2 = 0, clipped V = 0.7 -> 0.09; max 0.09 (clipped branch wins)
    # t1: V=0, Vold=0.1, R=2: 4; clipped 0 -> 4 | t2: V=2, Vold=1, R=0: 4; clipped 1.2 -> 1.44; max 4
    # loss = 0.5 * (0.09 + 4 + 4) / 3
    values = t([[1.0, 0, 2, 50]])
    values.stop_gradient = False
    loss = alg.critic_loss(values, t([[0.5, 0.1, 1, 0]]), t([[1.0, 2, 0, -50]]), t([[1.0, 1, 1, 0]]), 0.2)
    close(loss, 0.5 * 8.09 / 3)
    loss.backward()
    # d/dV: t0 clipped (0), t1 (V - R)/3 = -2/3, t2 2/3, masked 0
    close(values.grad, [[0, -2 / 3, 2 / 3, 0]])


def test_explained_variance():
    r, m = t([[1.0, 2, 3, 4, 77]]), t([[1.0, 1, 1, 1, 0]])
    close(alg.explained_variance(t([[1.0, 2, 3, 4, -5]]), r, m), 1.0)  # perfect
    close(alg.explained_variance(t([[0.0, 1, 2, 3, 0]]), r, m), 1.0)  # constant offset
    close(alg.explained_variance(t([[2.5] * 5]), r, m), 0.0)  # mean predictor
    # V = [1, 2, 3, 5]: R - V = [0, 0, 0, -1], var = 0.1875; Var(R) = 1.25 -> 1 - 0.15 = 0.85
    close(alg.explained_variance(t([[1.0, 2, 3, 5, 0]]), r, m), 0.85)
    close(alg.explained_variance(t([[1.0, 2, 3]]), t([[4.0, 4, 4]]), t([[1.0, 1, 1]])), 0.0)  # Var(R)=0 -> 0
    close(alg.explained_variance(r, r, t(np.zeros((1, 5)))), 0.0)  # all-masked -> 0


# ---------------------------------------------------------------- group estimators
def group_advantages(name):
    """The per-response advantages [N] of the group estimator registered as `name`: (rewards [N], group size)."""
    return ADVANTAGE_ESTIMATORS[name].per_response


def test_group_advantages_hand_worked():
    r = t([1.0, 2, 3, 0, 0, 0])  # two prompts x 3 samples; group 1 mean 2, std (ddof 1) 1; group 2 constant
    close(group_advantages("grpo")(r, 3), [-1 / (1 + 1e-6), 0, 1 / (1 + 1e-6), 0, 0, 0])
    close(group_advantages("dr_grpo")(r, 3), [-1, 0, 1, 0, 0, 0])
    # rloo: 1 - (2+3)/2 = -1.5, 2 - (1+3)/2 = 0, 3 - (1+2)/2 = 1.5
    close(group_advantages("rloo")(r, 3), [-1.5, 0, 1.5, 0, 0, 0])
    # reinforce_baseline: centered [-1, 0, 1, 0, 0, 0], batch std (ddof 1) sqrt(2 / 5)
    s = math.sqrt(0.4) + 1e-6
    close(group_advantages("reinforce_baseline")(r, 3), [-1 / s, 0, 1 / s, 0, 0, 0])
    close(group_advantages("rloo")(t([1.0, 3, 5, 5]), 2), [-2, 2, 0, 0])


def test_group_advantages_numpy_reference():
    rng = np.random.default_rng(5)
    r = rng.normal(size=12) * 3
    g = r.reshape(3, 4)
    c = g - g.mean(1, keepdims=True)
    close(group_advantages("grpo")(t(r), 4), (c / (g.std(1, ddof=1, keepdims=True) + 1e-6)).ravel(), 1e-4)
    close(group_advantages("dr_grpo")(t(r), 4), c.ravel(), 1e-4)
    loo = np.array([[row[i] - np.delete(row, i).mean() for i in range(4)] for row in g])
    close(group_advantages("rloo")(t(r), 4), loo.ravel(), 1e-4)
    close(group_advantages("reinforce_baseline")(t(r), 4), (c / (c.std(ddof=1) + 1e-6)).ravel(), 1e-4)


def test_group_size_one_and_errors():
    r = t([1.0, 5, -2])
    close(group_advantages("dr_grpo")(r, 1), [0, 0, 0])
    out = group_advantages("reinforce_baseline")(r, 1)
    close(out, [0, 0, 0])
    assert np.isfinite(out.numpy()).all()
    for estimate in (group_advantages("grpo"), group_advantages("rloo")):
        with pytest.raises(ValueError, match="num_return_sequences >= 2"):
            estimate(r, 1)
    with pytest.raises(ValueError, match="num_return_sequences=2"):
        group_advantages("grpo")(r, 2)  # 3 rewards are not whole groups of 2


def test_broadcast_sequence_advantages():
    out = alg.broadcast_sequence_advantages(t([2.0, -1, 3]), t([[1.0, 1, 0], [0, 1, 1], [0, 0, 0]]))
    assert out.shape == [3, 3]
    close(out, [[2, 2, 0], [0, -1, -1], [0, 0, 0]])


# ---------------------------------------------------------------- REINFORCE++
def test_reinforce_plus_plus_hand_worked():
    # row 0: k1 kl = [0.5, 0, -1], kl_coeff 0.1 -> r = [-0.05, 0, -(-0.1) + 1] = [-0.05, 0, 1.1]
    #        returns-to-go (gamma 1) = [1.05, 1.1, 1.1]
    # row 1: left-padded block at t=1..2, no KL, score -1 -> returns [-, -1, -1]; row 2 all-masked
    # whiten the 5 values [1.05, 1.1, 1.1, -1, -1]: mean 0.25, deviations [0.8, 0.85, 0.85, -1.25, -1.25],
    # unbiased var = (0.64 + 0.7225 + 0.7225 + 1.5625 + 1.5625) / 4 = 1.3025
    lp = t([[-1.0, -2, -3, 0], [-1, -1, -1, -1], [0, 0, 0, 0]])
    ref = t([[-1.5, -2, -2, 7], [-1, -1, -1, -1], [5, 5, 5, 5]])
    mask = t([[1.0, 1, 1, 0], [0, 1, 1, 0], [0, 0, 0, 0]])
    adv = alg.reinforce_plus_plus_advantages(t([1.0, -1, 4]), lp, ref, mask, 0.1, 1.0, kl_estimate("k1"))
    s = math.sqrt(1.3025 + 1e-8)
    close(adv, [[0.8 / s, 0.85 / s, 0.85 / s, 0], [0, -1.25 / s, -1.25 / s, 0], [0, 0, 0, 0]])
    # gamma 0.5, row 0: G2 = 1.1, G1 = 0 + 0.5 * 1.1 = 0.55, G0 = -0.05 + 0.5 * 0.55 = 0.225
    adv = alg.reinforce_plus_plus_advantages(t([1.0, -1, 4]), lp, ref, mask, 0.1, 0.5, kl_estimate("k1"))
    rtg = np.array([[0.225, 0.55, 1.1, 0], [0, -0.5, -1, 0], [0, 0, 0, 0]])
    close(adv, ref_whiten(rtg, mask.numpy()), 1e-4)


def test_reinforce_plus_plus_reference_random():
    rng = np.random.default_rng(6)
    lp, ref = rng.normal(size=(3, 6)) - 2, rng.normal(size=(3, 6)) - 2
    masks = np.array([[1, 1, 1, 1, 0, 0], [0, 0, 1, 1, 1, 1], [1] * 6], dtype="float32")
    scores, gamma, coeff = rng.normal(size=3), 0.9, 0.05
    rtg = np.zeros((3, 6))
    for b in range(3):
        idx = np.flatnonzero(masks[b])
        k3 = np.exp(ref[b] - lp[b]) - (ref[b] - lp[b]) - 1
        r = -coeff * k3[idx]
        r[-1] += scores[b]
        running = 0.0
        for k in range(len(idx) - 1, -1, -1):
            running = r[k] + gamma * running
            rtg[b, idx[k]] = running
    adv = alg.reinforce_plus_plus_advantages(t(scores), t(lp), t(ref), t(masks), coeff, gamma, kl_estimate("k3"))
    close(adv, ref_whiten(rtg, masks), 1e-4)
