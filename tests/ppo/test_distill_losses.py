"""Distillation losses (alignment/ppo/rl_math/distill.py): against TRL's GKD loss as recorded by
tests/scripts/record_trl_gkd.py (tests/fixtures/trl_gkd.json), and each loss against values computed by hand."""
import json
import math
import os
import subprocess
import sys

import numpy as np
import paddle
import pytest

from alignment.ppo.rl_math import distill
from alignment.ppo.rl_math.surrogate import aggregate_loss

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TRL_VENV = "/tmp/trlv/bin/python"


def fixture():
    with open(os.path.join(HERE, "fixtures", "trl_gkd.json")) as f:
        return json.load(f)


def our_gkd_loss(student, teacher, labels, beta, temperature, dtype):
    """Our per-token divergence, token-mean over the label positions (TRL's batchmean)."""
    logits = paddle.to_tensor(np.asarray(student, dtype=dtype), stop_gradient=False)
    per_token = distill.full_vocab_divergence(logits, paddle.to_tensor(np.asarray(teacher, dtype=dtype)), beta,
                                              temperature)  # [B, T]
    mask = paddle.to_tensor((np.asarray(labels) != -100).astype(dtype))
    loss = aggregate_loss(per_token, mask, "token-mean") if dtype == "float32" else \
        (per_token * mask).sum() / mask.sum()
    loss.backward()
    return float(loss), logits.grad.numpy()


def relative(ours, theirs):
    theirs = np.asarray(theirs)
    return float(np.abs(np.asarray(ours) - theirs).max() / max(np.abs(theirs).max(), 1e-30))


# float32: the inputs themselves are rounded to float32 (~1e-7 each), amplified at temperature 0.5
@pytest.mark.parametrize("dtype,tolerance", [("float64", 1e-12), ("float32", 1e-5)])
def test_gkd_loss_and_gradient_match_trl_every_beta_and_temperature(dtype, tolerance):
    data = fixture()
    assert data["trl_version"] == "1.12.0" and len(data["cases"]) == 15
    for case in data["cases"]:
        loss, grad = our_gkd_loss(data["student_logits"], data["teacher_logits"], data["labels"], case["beta"],
                                  case["temperature"], dtype)
        assert abs(loss - case["loss"]) <= tolerance * abs(case["loss"]), case["beta"]
        assert relative(grad, case["grad"]) <= tolerance, (case["beta"], case["temperature"])
        assert np.all(np.asarray(case["grad"])[2] == 0) and np.all(grad[2] == 0)  # the all-masked row


@pytest.mark.slow
@pytest.mark.skipif(not os.path.exists(TRL_VENV), reason="no TRL venv at /tmp/trlv")
def test_live_trl_still_gives_the_recorded_numbers():
    out = subprocess.run([TRL_VENV, os.path.join(HERE, "scripts", "record_trl_gkd.py"), "--check"],
                         capture_output=True, text=True, check=True)
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["max_relative_difference"] <= 1e-12, result


# --- by hand: two outcomes, p_S = (0.8, 0.2), p_T = (0.5, 0.5) at one position ------------------------------------
S, T = np.array([0.8, 0.2]), np.array([0.5, 0.5])


def kl(p, q):
    return float(np.sum(p * np.log(p / q)))


def logits_of(p):
    return paddle.to_tensor(np.log(p).reshape([1, 1, -1]))


@pytest.mark.parametrize("beta", [0.0, 0.3, 0.5, 1.0])
def test_generalized_jsd_by_hand(beta):
    if beta == 0:
        expected = kl(T, S)  # forward KL(T || S) = 0.5 ln(0.5/0.8) + 0.5 ln(0.5/0.2) = 0.2231...
    elif beta == 1:
        expected = kl(S, T)  # reverse KL(S || T) = 0.8 ln 1.6 + 0.2 ln 0.4 = 0.1927...
    else:
        m = (1 - beta) * S + beta * T
        expected = beta * kl(T, m) + (1 - beta) * kl(S, m)
    got = distill.full_vocab_divergence(logits_of(S), logits_of(T), beta)
    assert got.shape == [1, 1]
    assert float(got.reshape([])) == pytest.approx(expected, rel=1e-12)
    assert distill.full_vocab_divergence(logits_of(S), logits_of(S), beta).numpy() == pytest.approx(0, abs=1e-15)


def test_forward_and_reverse_kl_are_jsd_at_beta_0_and_1_whatever_beta_says():
    forward, reverse = distill.ForwardKL(), distill.ReverseKL()
    assert float(forward.per_token(logits_of(S), logits_of(T), 0.5, 1.0).reshape([])) == pytest.approx(0.5 * math.log(0.625)
                                                                                           + 0.5 * math.log(2.5))
    assert float(reverse.per_token(logits_of(S), logits_of(T), 0.5, 1.0).reshape([])) == pytest.approx(0.8 * math.log(1.6)
                                                                                           + 0.2 * math.log(0.4))


def test_temperature_divides_both_models_logits():
    z_s, z_t = np.array([2.0, 0.0, -1.0]), np.array([0.0, 1.0, 1.0])
    soft = lambda z: np.exp(z - z.max()) / np.exp(z - z.max()).sum()  # noqa: E731
    got = distill.full_vocab_divergence(paddle.to_tensor(z_s.reshape([1, 1, 3])),
                                        paddle.to_tensor(z_t.reshape([1, 1, 3])), 0.0, temperature=2.0)
    assert float(got.reshape([])) == pytest.approx(kl(soft(z_t / 2), soft(z_s / 2)), rel=1e-12)


def test_topk_divergence_by_hand_with_the_tail_bucket():
    """Vocabulary of 4; the teacher returns its top 2 (tokens 2 and 0). Buckets: token 2, token 0, the rest."""
    p_s, p_t = np.array([0.1, 0.2, 0.3, 0.4]), np.array([0.3, 0.1, 0.5, 0.1])
    ids = paddle.to_tensor(np.array([2, 0]).reshape([1, 1, 2]))
    top = paddle.to_tensor(np.log(p_t[[2, 0]]).reshape([1, 1, 2]))
    s_b, t_b = np.array([0.3, 0.1, 0.6]), np.array([0.5, 0.3, 0.2])
    forward = distill.topk_divergence(logits_of(p_s), ids, top, beta=0.0)
    assert float(forward.reshape([])) == pytest.approx(kl(t_b, s_b), rel=1e-12)
    assert float(forward.reshape([])) <= kl(p_t, p_s)  # coarsening never increases a KL
    m = 0.5 * s_b + 0.5 * t_b
    assert float(distill.topk_divergence(logits_of(p_s), ids, top, beta=0.5).reshape([])) == pytest.approx(
        0.5 * kl(t_b, m) + 0.5 * kl(s_b, m), rel=1e-12)
    # the teacher's whole vocabulary as its "top-k": the tail is empty (clipped at 1 - 1e-7) and the loss is the
    # full-vocabulary KL up to that clip
    every = paddle.to_tensor(np.array([0, 1, 2, 3]).reshape([1, 1, 4]))
    got = distill.topk_divergence(logits_of(p_s), every, paddle.to_tensor(np.log(p_t).reshape([1, 1, 4])), 0.0)
    assert float(got.reshape([])) == pytest.approx(kl(p_t, p_s), abs=1e-6)


def test_sampled_kl_advantages_by_hand_padding_and_all_masked_rows():
    student = paddle.to_tensor([[-1.0, -2.0, -0.5], [-3.0, -3.0, -3.0]])
    teacher = paddle.to_tensor([[-1.5, -1.0, -9.0], [-1.0, -1.0, -1.0]])
    mask = paddle.to_tensor([[1.0, 1.0, 0.0], [0.0, 0.0, 0.0]])  # a padded token; an all-masked row
    got = distill.sampled_kl_advantages(student, teacher, mask).numpy()
    assert got.tolist() == [[-0.5, 1.0, 0.0], [0.0, 0.0, 0.0]]


def test_registered_losses_and_their_traits():
    from alignment.config.registry import DISTILL_LOSSES

    assert DISTILL_LOSSES.names() == ["sampled_kl", "jsd", "forward_kl", "reverse_kl", "topk_kl"]
    assert DISTILL_LOSSES["sampled_kl"].as_advantage and DISTILL_LOSSES["sampled_kl"].on_policy_only
    assert DISTILL_LOSSES["jsd"].full_vocab and not DISTILL_LOSSES["topk_kl"].full_vocab
    assert DISTILL_LOSSES["topk_kl"].top_k


def test_fixture_was_recorded_by_the_committed_script():
    source = open(os.path.join(HERE, "scripts", "record_trl_gkd.py")).read()
    assert "generalized_jsd_loss" in source and sys.version_info >= (3, 8)
    data = fixture()
    assert np.asarray(data["student_logits"]).shape == (3, 5, 11)
