"""PaddleNLP's / PaddleFormers' DPO loss types (paddlenlp/trl/dpo_criterion.py `dpo_loss`,
paddleformers/nn/criterion/dpo_loss.py `cal_dpo_loss`): dpop, kto_pair, sppo_hard, nca_pair, or, each against
values worked out by hand on test_dpo.py's 2-pair batch, and one DPO step with each on the tiny model."""
import json
import math
import os

import numpy as np
import pytest

from alignment.dpo.losses import preference_loss
from tests.dpo.test_dpo import CONFIG, NC, NR, PC, PR, RR, losses_of, softplus, t


def sigmoid(x):
    return 1 / (1 + math.exp(-x))


def test_dpop_penalises_a_chosen_answer_that_lost_probability_by_hand():
    # chosen ratios c = [-0.5, 0.5] (pair 1 lost 0.5), rejected r = [-0.5, -0.5]: h = [0, 1]; lambda 2:
    # beta (h - lambda max(0, -c)) = 0.1 [0 - 1, 1 - 0] -> -log s: [softplus(0.1), softplus(-0.1)]
    losses, chosen, _ = preference_loss(t(PC), t(PR), t([-0.5, -2.5]), t(RR), t(NC), t(NR), "dpop", beta=0.1,
                                        dpop_lambda=2.0)
    np.testing.assert_allclose(losses.numpy(), [softplus(0.1), softplus(-0.1)], rtol=1e-6)
    np.testing.assert_allclose(losses.numpy(), [0.7443967, 0.6443967], rtol=1e-6)
    np.testing.assert_allclose(chosen.numpy(), [-0.05, 0.05], atol=1e-7)
    # no chosen answer lost probability in the shared batch: dpop is plain DPO there
    np.testing.assert_allclose(losses_of("dpop")[0], losses_of("sigmoid")[0], rtol=1e-6)


def test_kto_pair_uses_the_other_halfs_batch_kl_by_hand():
    # c = [0.5, 0], r = [-0.5, -0.5]; KL_c = max(0, mean c) = 0.25, KL_r = max(0, -0.5) = 0
    # chosen: 1 - s(0.1 (c - 0)); rejected: 1 - s(0.1 (0.25 - r)) = 1 - s(0.075); per pair the mean of the two
    losses, _, _ = losses_of("kto_pair", beta=0.1)
    expected = [((1 - sigmoid(0.05)) + (1 - sigmoid(0.075))) / 2, ((1 - sigmoid(0.0)) + (1 - sigmoid(0.075))) / 2]
    np.testing.assert_allclose(losses, expected, rtol=1e-6)
    np.testing.assert_allclose(losses, [0.4843807, 0.4906294], rtol=1e-6)


def test_sppo_hard_by_hand():
    # (c - 1/(2 beta))^2 + (r + 1/(2 beta))^2 with 1/(2 beta) = 5: (0.5 - 5)^2 + 4.5^2, (0 - 5)^2 + 4.5^2
    losses, _, _ = losses_of("sppo_hard", beta=0.1)
    np.testing.assert_allclose(losses, [40.5, 45.25], rtol=1e-6)


def test_nca_pair_by_hand():
    # beta c = [0.05, 0], beta r = [-0.05, -0.05]: softplus(-bc) + 0.5 softplus(bc) + 0.5 softplus(br)
    losses, _, _ = losses_of("nca_pair", beta=0.1)
    expected = [softplus(-0.05) + 0.5 * softplus(0.05) + 0.5 * softplus(-0.05),
                softplus(0.0) + 0.5 * softplus(0.0) + 0.5 * softplus(-0.05)]
    np.testing.assert_allclose(losses, expected, rtol=1e-6)
    np.testing.assert_allclose(losses, [1.3619193, 1.3739506], rtol=1e-6)


def test_odds_ratio_is_reference_free_on_token_averaged_log_probs_by_hand():
    # averaged log-probs: chosen [-1/2, -2/4] = [-0.5, -0.5], rejected [-3/3, -1.5/1] = [-1, -1.5]
    def log_odds(p):
        return p - math.log1p(-math.exp(p))
    losses, _, _ = losses_of("or", beta=0.1)
    expected = [softplus(-(log_odds(-0.5) - log_odds(-1.0))), softplus(-(log_odds(-0.5) - log_odds(-1.5)))]
    np.testing.assert_allclose(losses, expected, rtol=1e-6)
    np.testing.assert_allclose(losses, [0.3202998, 0.1708592], rtol=1e-6)
    moved, _, _ = preference_loss(t(PC), t(PR), t([7.0, 7.0]), t([-7.0, 3.0]), t(NC), t(NR), "or", beta=0.1)
    np.testing.assert_allclose(moved.numpy(), losses, rtol=1e-6)  # the reference does not enter


# At step 1 the policy is the reference, so every pair's log-ratios are c = r = 0 and each loss with a reference
# has a closed form (beta 0.1 in config/tiny/dpo_argument.json): dpop -log s(0) = ln 2; kto_pair
# ((1 - s(0)) + (1 - s(0))) / 2 = 0.5; sppo_hard (0 - 5)^2 + (0 + 5)^2 = 50; nca_pair -log s(0) - 0.5 log s(0)
# - 0.5 log s(0) = 2 ln 2. The reference-free `or` is checked against its formula on the step's own token-averaged
# log-probs.
AT_STEP_ONE = {"dpop": math.log(2), "kto_pair": 0.5, "sppo_hard": 50.0, "nca_pair": 2 * math.log(2)}


@pytest.mark.parametrize("loss_type", ["dpop", "kto_pair", "sppo_hard", "nca_pair", "or"])
def test_each_paddlenlp_loss_type_trains_a_step(loss_type, tmp_path, tiny_model_dir, monkeypatch):
    from safetensors.numpy import load_file

    from alignment.dpo import run_dpo, dpo_trainer as trainer
    from tests.helpers import read_metrics

    seen = []

    def recording(*args, **kwargs):
        seen.append([a.numpy().copy() for a in args[:6]])  # policy / reference chosen, rejected; token counts
        return preference_loss(*args, **kwargs)

    monkeypatch.setattr(trainer, "preference_loss", recording)
    out = tmp_path / "out"
    run_dpo.main([CONFIG, "--model_name_or_path", tiny_model_dir, "--output_dir", str(out), "--max_steps", "1",
                  "--loss_type", loss_type, "--eval_datasets", "", "--per_device_train_batch_size", "4",
                  "--disable_tqdm", "true"])
    args = json.load(open(os.path.join(out, "args.json")))
    (row,) = read_metrics(out)
    assert args["loss_type"] == loss_type and len(seen) == 1
    if loss_type == "or":
        pc, pr, _, _, nc, nr = seen[0]

        def log_odds(p):
            return p - np.log1p(-np.exp(p))
        expected = np.mean([softplus(-x) for x in log_odds(pc / nc) - log_odds(pr / nr)])
        assert expected != pytest.approx(math.log(2), abs=1e-3)
    else:
        expected = AT_STEP_ONE[loss_type]
        assert row["rewards/margin"] == 0.0  # policy == reference
    assert row["loss"] == pytest.approx(expected, rel=1e-5)
    start, end = load_file(f"{tiny_model_dir}/model.safetensors"), load_file(str(out / "model" / "model.safetensors"))
    assert any(not np.array_equal(start[k], end[k]) for k in start)  # the loss had a gradient: the step trained
