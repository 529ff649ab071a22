"""DPO-family and KTO losses (golden values by hand), response log-probs, and tiny end-to-end runs."""
import json
import math
import os

import numpy as np
import paddle
import pytest

from alignment.dpo import run_dpo
from alignment.dpo.data import UnpairedDataset, collate_pairs, collate_unpaired
from alignment.dpo.losses import kto_kl_estimate, kto_loss, preference_loss
from alignment.dpo.dpo_trainer import sequence_log_probs

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CONFIG = os.path.join(REPO, "config", "tiny", "dpo_argument.json")

# a 2-pair batch: summed log-probs of policy / reference on chosen / rejected, and response token counts
PC, PR, RC, RR = [-1.0, -2.0], [-3.0, -1.5], [-1.5, -2.0], [-2.5, -1.0]
NC, NR = [2.0, 4.0], [3.0, 1.0]


def t(values):
    return paddle.to_tensor(values, dtype="float32")


def losses_of(loss_type, **kwargs):
    losses, chosen, rejected = preference_loss(t(PC), t(PR), t(RC), t(RR), t(NC), t(NR), loss_type, **kwargs)
    return losses.numpy(), chosen.numpy(), rejected.numpy()


def softplus(x):  # -log sigmoid(-x)
    return math.log1p(math.exp(x))


def test_dpo_sigmoid_loss_by_hand():
    # h = (pc - pr) - (rc - rr): pair 1: 2 - 1 = 1; pair 2: -0.5 - (-1) = 0.5
    losses, chosen, rejected = losses_of("sigmoid", beta=0.1)
    np.testing.assert_allclose(losses, [softplus(-0.1), softplus(-0.05)], rtol=1e-6)
    np.testing.assert_allclose(losses, [0.6443967, 0.6684596], rtol=1e-6)
    np.testing.assert_allclose(chosen, [0.05, 0.0], atol=1e-7)  # beta (pc - rc)
    np.testing.assert_allclose(rejected, [-0.05, -0.05], atol=1e-7)  # beta (pr - rr)


def test_cdpo_label_smoothing_by_hand():
    losses, _, _ = losses_of("sigmoid", beta=0.1, label_smoothing=0.1)
    np.testing.assert_allclose(losses, [0.9 * softplus(-0.1) + 0.1 * softplus(0.1),
                                        0.9 * softplus(-0.05) + 0.1 * softplus(0.05)], rtol=1e-6)


def test_ipo_loss_uses_token_averaged_ratios_by_hand():
    # chosen ratios [0.5, 0] / [2, 4]; rejected ratios [-0.5, -0.5] / [3, 1] -> margins [0.41667, 0.5]; 1/(2 beta) = 5
    losses, _, _ = losses_of("ipo", beta=0.1)
    np.testing.assert_allclose(losses, [(0.5 / 2 + 0.5 / 3 - 5) ** 2, (0.5 - 5) ** 2], rtol=1e-6)
    np.testing.assert_allclose(losses, [21.006944, 20.25], rtol=1e-6)


def test_hinge_loss_by_hand():
    losses, _, _ = losses_of("hinge", beta=0.1)
    np.testing.assert_allclose(losses, [0.9, 0.95], rtol=1e-6)
    losses, _, _ = losses_of("hinge", beta=2.0)  # beta h >= 1: no loss
    np.testing.assert_allclose(losses, [0.0, 0.0], atol=1e-7)


def test_simpo_loss_is_reference_free_and_length_normalised_by_hand():
    # beta 2, gamma 0.5: pair 1: 2 (-1/2 + 3/3) - 0.5 = 0.5; pair 2: 2 (-2/4 + 1.5/1) - 0.5 = 1.5
    losses, chosen, rejected = losses_of("simpo", beta=2.0, simpo_gamma=0.5)
    np.testing.assert_allclose(losses, [softplus(-0.5), softplus(-1.5)], rtol=1e-6)
    np.testing.assert_allclose(losses, [0.4740770, 0.2014133], rtol=1e-6)
    np.testing.assert_allclose(chosen, [-1.0, -1.0], rtol=1e-6)
    np.testing.assert_allclose(rejected, [-2.0, -3.0], rtol=1e-6)
    moved, _, _ = preference_loss(t(PC), t(PR), t([9.0, 9.0]), t([-9.0, 4.0]), t(NC), t(NR), "simpo", beta=2.0)
    np.testing.assert_allclose(moved.numpy(), losses, rtol=1e-6)  # the reference does not enter


def test_kto_loss_by_hand():
    # ratios [0.5, -1.0]; kl 0.2; row 1 desirable: 2 (1 - s(0.1 (0.5 - 0.2))); row 2 undesirable: 1 - s(0.1 (0.2 + 1))
    losses, chosen, rejected = kto_loss(t([-1.0, -2.0]), t([-1.5, -1.0]), paddle.to_tensor([True, False]),
                                        paddle.to_tensor(0.2), beta=0.1, desirable_weight=2.0)
    sig = lambda x: 1 / (1 + math.exp(-x))  # noqa: E731
    np.testing.assert_allclose(losses.numpy(), [2 * (1 - sig(0.03)), 1 - sig(0.12)], rtol=1e-6)
    np.testing.assert_allclose(losses.numpy(), [0.9850011, 0.4700359], rtol=1e-6)
    np.testing.assert_allclose(chosen.numpy(), [0.05, 0.0], atol=1e-7)
    np.testing.assert_allclose(rejected.numpy(), [0.0, -0.1], atol=1e-7)


def test_kto_reference_point_is_a_clamped_mean():
    assert float(kto_kl_estimate(t([-1.0, -2.0]), t([-1.2, -1.5]))) == 0.0  # mean -0.15 -> clamped
    np.testing.assert_allclose(float(kto_kl_estimate(t([-1.0, -1.0]), t([-1.2, -1.6]))), 0.4, rtol=1e-6)


def manual_sum_logps(model, ids, response_mask):
    logits = model(paddle.to_tensor(ids)).logits.numpy()  # [b, s, V]
    logp = logits - np.log(np.exp(logits - logits.max(-1, keepdims=True)).sum(-1, keepdims=True)) - \
        logits.max(-1, keepdims=True)
    out = []
    for row in range(ids.shape[0]):
        out.append(sum(logp[row, k - 1, ids[row, k]] for k in range(1, ids.shape[1]) if response_mask[row, k]))
    return np.array(out)


def test_sequence_log_probs_sum_response_tokens_only_for_both_padding_sides(tiny_model_dir):
    from alignment.models import LlamaForCausalLM

    model = LlamaForCausalLM.from_pretrained(tiny_model_dir)
    model.eval()
    rows = [[5, 6, 7, 8, 9], [10, 11, 12]]  # answers start at 3 and 1
    right = collate_pairs([{"better_input_ids": rows[0], "worse_input_ids": rows[1], "better_prompt_len": 3,
                            "worse_prompt_len": 1}], pad_token_id=0)
    np.testing.assert_array_equal(right["response_mask"], [[0, 0, 0, 1, 1], [0, 1, 1, 0, 0]])
    sums, counts = sequence_log_probs(model, *(paddle.to_tensor(right[k]) for k in
                                               ("input_ids", "attention_mask", "response_mask")))
    # the same rows left-padded: the pad sits before the prompt, the sums must not change
    left_ids = np.array([[5, 6, 7, 8, 9], [0, 0, 10, 11, 12]])
    left_attn = np.array([[1, 1, 1, 1, 1], [0, 0, 1, 1, 1]])
    left_resp = np.array([[0, 0, 0, 1, 1], [0, 0, 0, 1, 1]])
    left_sums, left_counts = sequence_log_probs(model, paddle.to_tensor(left_ids), paddle.to_tensor(left_attn),
                                                paddle.to_tensor(left_resp))
    np.testing.assert_array_equal(counts.numpy(), [2, 2])
    np.testing.assert_array_equal(left_counts.numpy(), [2, 2])
    np.testing.assert_allclose(left_sums.numpy(), sums.numpy(), rtol=1e-5)
    first = manual_sum_logps(model, np.array([rows[0]]), np.array([[0, 0, 0, 1, 1]]))
    second = manual_sum_logps(model, np.array([rows[1]]), np.array([[0, 1, 1]]))
    np.testing.assert_allclose(sums.numpy(), [first[0], second[0]], rtol=1e-5)
    masked, masked_counts = sequence_log_probs(model, paddle.to_tensor(left_ids), paddle.to_tensor(left_attn),
                                               paddle.zeros([2, 5], dtype="int64"))  # all-masked rows
    np.testing.assert_array_equal(masked.numpy(), [0.0, 0.0])
    np.testing.assert_array_equal(masked_counts.numpy(), [0.0, 0.0])


def test_unpaired_rows_from_pairs_and_their_mismatched_completions(tiny_model_dir):
    from alignment.models import Tokenizer

    tokenizer = Tokenizer.from_pretrained(tiny_model_dir)
    raw = [{"input": "Say hi.", "answer": "Hi!", "other_answer": "No.", "better": False},
           {"input": "Count to two.", "answer": "One, two.", "desirable": True}]
    data = UnpairedDataset(raw, tokenizer, max_length=128, seed=0)
    assert [item["desirable"] for item in data] == [False, True, True]  # the worse side of the pair first
    assert data.stats["unpaired_pairs"] == 1
    completions = [tuple(item["completion_ids"]) for item in data]
    mismatched = [tuple(item["kl_completion_ids"]) for item in data]
    assert sorted(mismatched) == sorted(completions) and all(a != b for a, b in zip(completions, mismatched))
    batch = collate_unpaired(list(data), tokenizer.pad_token_id)
    assert batch["input_ids"].shape[0] == 3 and batch["kl_input_ids"].shape[0] == 3
    assert (batch["response_mask"].sum(1) == [len(c) for c in completions]).all()


def run(tmp_path, tiny_model_dir, *extra):
    return run_dpo.main([CONFIG, "--model_name_or_path", tiny_model_dir, "--output_dir", str(tmp_path / "out"),
                         "--disable_tqdm", "--train_datasets", f"PKU-SafeRLHF/train:1.0:{REPO}/data/preference",
                         "--eval_datasets", f"PKU-SafeRLHF/test:1.0:{REPO}/data/preference", "--eval_steps", "0",
                         "--per_device_train_batch_size", "8", *extra])


def read_metrics(out):
    return [json.loads(line) for line in open(out / "metrics.jsonl")]


def test_tiny_dpo_run_raises_held_out_preference_accuracy(tmp_path, tiny_model_dir):
    results = run(tmp_path, tiny_model_dir, "--max_steps", "12", "--logging_steps", "4", "--learning_rate", "3e-3")
    assert results["start_eval/loss"] == pytest.approx(math.log(2), abs=1e-5)  # policy == reference at the start
    assert results["eval/rewards/accuracy"] > results["start_eval/rewards/accuracy"] + 0.5
    assert results["eval/loss"] < results["start_eval/loss"] - 0.05 and results["eval/rewards/margin"] > 0
    rows = read_metrics(tmp_path / "out")
    assert {"loss", "rewards/chosen", "rewards/rejected", "rewards/margin", "rewards/accuracy", "logps/chosen",
            "logps/rejected"} <= set(rows[1])
    from alignment.models import LlamaForCausalLM
    LlamaForCausalLM.from_pretrained(str(tmp_path / "out" / "model"))


def test_cached_reference_log_probs_equal_the_live_reference(tmp_path, tiny_model_dir):
    live = run(tmp_path / "a", tiny_model_dir, "--max_steps", "2", "--logging_steps", "1")
    cached = run(tmp_path / "b", tiny_model_dir, "--max_steps", "2", "--logging_steps", "1",
                 "--precompute_ref_log_probs", "true")
    for key in ("eval/loss", "eval/rewards/margin", "start_eval/loss"):
        assert cached[key] == pytest.approx(live[key], rel=1e-5, abs=1e-6), key


@pytest.mark.parametrize("extra", [["--loss_type", "kto", "--precompute_ref_log_probs", "true"],
                                   ["--loss_type", "simpo", "--beta", "2.0"],
                                   ["--loss_type", "ipo", "--nll_loss_coef", "0.5"]])
def test_variants_train_end_to_end(tmp_path, tiny_model_dir, extra):
    results = run(tmp_path, tiny_model_dir, "--max_steps", "6", "--logging_steps", "3", "--learning_rate", "3e-3",
                  *extra)
    assert np.isfinite(results["eval/loss"]) and results["eval/loss"] < results["start_eval/loss"]
    assert results["eval/rewards/margin"] > results["start_eval/rewards/margin"]


@pytest.mark.parametrize("extra, fragment", [
    (["--beta", "0"], "key 'beta' must be > 0"),
    (["--loss_type", "simpo", "--ref_model_name_or_path", "x"], "key 'ref_model_name_or_path' contradicts"),
    (["--loss_type", "ipo", "--label_smoothing", "0.1"], "key 'label_smoothing'"),
    (["--loss_type", "dpo"], "key 'loss_type' must be one of"),
])
def test_bad_arguments_stop_before_anything_is_written(tmp_path, tiny_model_dir, capsys, extra, fragment):
    with pytest.raises(SystemExit) as info:
        run(tmp_path, tiny_model_dir, *extra)
    assert info.value.code == 2 and fragment in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_prompts_that_fill_max_length_are_skipped_with_a_count(tmp_path, tiny_model_dir, capsys):
    pair = {"prompt": "Tell me something nice. " * 40, "response_0": "You are kind.", "response_1": "No.",
            "better_response_id": 0, "safer_response_id": 0, "is_response_0_safe": True, "is_response_1_safe": True}
    short = {**pair, "prompt": "Tell me something nice."}
    path = tmp_path / "pairs.jsonl"
    path.write_text(json.dumps(pair) + "\n" + json.dumps(short) + "\n")
    run(tmp_path, tiny_model_dir, "--train_datasets", f"PKU-SafeRLHF/train:1.0:{path}", "--eval_datasets", "",
        "--max_steps", "1", "--max_length", "64")
    assert "'dropped_prompt_too_long': 1" in capsys.readouterr().out
    path.write_text(json.dumps(pair) + "\n")
    with pytest.raises(SystemExit) as info:  # nothing left to train on
        run(tmp_path / "again", tiny_model_dir, "--train_datasets", f"PKU-SafeRLHF/train:1.0:{path}",
            "--eval_datasets", "", "--max_steps", "1", "--max_length", "64")
    assert info.value.code == 2 and "empty after tokenization" in capsys.readouterr().err
    assert not (tmp_path / "again" / "out").exists()


def test_identical_chosen_and_rejected_fail_naming_the_line(tmp_path, tiny_model_dir, capsys):
    pair = {"prompt": "Q?", "response_0": "Same.", "response_1": "Same.", "better_response_id": 0,
            "safer_response_id": 0, "is_response_0_safe": True, "is_response_1_safe": True}
    path = tmp_path / "pairs.jsonl"
    path.write_text(json.dumps(pair) + "\n")
    with pytest.raises(SystemExit) as info:
        run(tmp_path, tiny_model_dir, "--train_datasets", f"PKU-SafeRLHF/train:1.0:{path}", "--eval_datasets", "")
    err = capsys.readouterr().err
    assert info.value.code == 2 and "pairs.jsonl line 1" in err and "identical" in err, err
