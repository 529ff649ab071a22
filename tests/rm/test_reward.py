"""Reward model: losses against hand-computed values, end-score indexing, save/load, end-to-end training."""
import json
import math
import os

import numpy as np
import paddle
import pytest

from alignment.models.normalizer import ExponentialMovingAverage, RunningMeanStd, make_normalizer
from alignment.models.score_model import ScoreModel, last_token_index
from alignment.rm import run_reward
from alignment.rm.losses import divergence_mask, sequence_wise_loss, token_wise_loss
from tests.helpers import REPO, read_metrics

RM_CONFIG = os.path.join(REPO, "config", "tiny", "rm_argument.json")


def logsig(x):
    return -math.log(1 + math.exp(-x))


def test_sequence_wise_loss_two_pairs_by_hand():
    better, worse = paddle.to_tensor([1.0, 0.5]), paddle.to_tensor([0.0, 1.0])
    expected = -(logsig(1.0) + logsig(-0.5)) / 2 + 0.1 * (1.0 + 0.25 + 0.0 + 1.0) / 4
    assert abs(float(sequence_wise_loss(better, worse, 0.1)) - expected) < 1e-6
    assert abs(float(sequence_wise_loss(better, worse, 0.0)) + (logsig(1.0) + logsig(-0.5)) / 2) < 1e-6


def test_token_wise_loss_two_pairs_by_hand():
    # pair 0: differ from column 2; better ends at 3, worse at 2 -> columns 2..3
    # pair 1: differ from column 1; both end at 2 -> columns 1..2 (column 3 is padding on both sides)
    better_ids = paddle.to_tensor([[1, 2, 3, 4], [7, 8, 9, 0]])
    worse_ids = paddle.to_tensor([[1, 2, 5, 0], [7, 6, 9, 0]])
    better_mask = paddle.to_tensor([[1, 1, 1, 1], [1, 1, 1, 0]])
    worse_mask = paddle.to_tensor([[1, 1, 1, 0], [1, 1, 1, 0]])
    np.testing.assert_array_equal(divergence_mask(better_ids, worse_ids, better_mask, worse_mask).numpy(),
                                  [[0, 0, 1, 1], [0, 1, 1, 0]])
    hs = paddle.to_tensor([[9.0, 9.0, 1.0, 2.0], [9.0, 0.5, 0.0, 9.0]])
    ls = paddle.to_tensor([[0.0, 0.0, 0.0, 3.0], [0.0, 1.0, 1.0, 0.0]])
    better_end, worse_end = paddle.to_tensor([2.0, 0.0]), paddle.to_tensor([0.0, 1.0])
    pair0 = -(logsig(1.0) + logsig(-1.0)) / 2
    pair1 = -(logsig(-0.5) + logsig(-1.0)) / 2
    reg = 0.01 * (4.0 + 0.0 + 0.0 + 1.0) / 4
    loss = token_wise_loss(hs, ls, better_end, worse_end, better_ids, worse_ids, better_mask, worse_mask, 0.01)
    assert abs(float(loss) - ((pair0 + pair1) / 2 + reg)) < 1e-6
    with pytest.raises(ValueError, match="identical"):
        divergence_mask(better_ids, better_ids, better_mask, better_mask)


def test_end_score_is_read_at_the_last_real_token_for_both_padding_sides(tiny_model_dir):
    mask = paddle.to_tensor([[1, 1, 1, 0, 0], [0, 0, 1, 1, 1], [1, 1, 1, 1, 1], [0, 0, 0, 0, 0]])
    assert last_token_index(mask).numpy().tolist() == [2, 4, 4, 4]
    model = ScoreModel.from_pretrained(tiny_model_dir)
    ids = paddle.to_tensor([[5, 6, 7, 3, 3], [3, 3, 5, 6, 7]])
    out = model(ids, paddle.to_tensor([[1, 1, 1, 0, 0], [0, 0, 1, 1, 1]]))
    assert out.end_index.numpy().tolist() == [2, 4]
    np.testing.assert_allclose(out.end_scores.numpy(), [out.scores[0, 2].item(), out.scores[1, 4].item()])
    # the same text gives the same end score whichever side is padded
    assert abs(out.end_scores[0].item() - out.end_scores[1].item()) < 1e-5


def test_normalizers_match_numpy_statistics():
    rng = np.random.default_rng(0)
    batches = [rng.normal(3.0, 2.0, size=n).astype("float32") for n in (5, 17, 1, 40)]
    running = RunningMeanStd()
    for batch in batches:
        running.update(paddle.to_tensor(batch))
    everything = np.concatenate(batches)
    assert abs(running.mean - everything.mean()) < 1e-5 and abs(running.var - everything.var()) < 1e-4
    assert running.count == 63
    ema = ExponentialMovingAverage(momentum=0.9)
    ema.update(paddle.to_tensor([1.0, 3.0]))
    ema.update(paddle.to_tensor([5.0, 5.0]))
    assert abs(ema.mean - (0.9 * 2.0 + 0.1 * 5.0)) < 1e-6 and abs(ema.var - 0.9 * 1.0) < 1e-6
    normalized = running.normalize(paddle.to_tensor(everything)).numpy()
    assert abs(normalized.mean()) < 1e-4 and abs(normalized.std() - 1) < 1e-3
    with pytest.raises(ValueError, match="normalizer_type"):
        make_normalizer("BatchNorm")


def test_saved_reward_model_reloads_with_identical_scores_and_normalizer(tmp_path, tiny_model_dir):
    model = ScoreModel.from_pretrained(tiny_model_dir, normalizer_type="ExponentialMovingAverage")
    assert model.head_initialised
    ids = paddle.to_tensor([[5, 6, 7, 8], [9, 10, 11, 3]])
    mask = paddle.to_tensor([[1, 1, 1, 1], [1, 1, 1, 0]])
    model.train()
    model(ids, mask)
    model.eval()
    model.save_pretrained(str(tmp_path / "rm"))
    loaded = ScoreModel.from_pretrained(str(tmp_path / "rm"))
    assert not loaded.head_initialised
    assert loaded.normalizer.state_dict() == model.normalizer.state_dict() and loaded.normalizer.count == 2
    np.testing.assert_array_equal(loaded(ids, mask).end_scores.numpy(), model(ids, mask).end_scores.numpy())
    config = json.load(open(tmp_path / "rm" / "config.json"))
    assert config["architectures"] == ["LlamaForSequenceClassification"] and config["num_labels"] == 1


def run(tmp_path, tiny_model_dir, *extra):
    return run_reward.main([RM_CONFIG, "--model_name_or_path", tiny_model_dir, "--output_dir", str(tmp_path / "out"),
                            "--disable_tqdm", "--train_datasets", f"PKU-SafeRLHF/train:1.0:{REPO}/data/preference",
                            "--eval_datasets", f"PKU-SafeRLHF/test:1.0:{REPO}/data/preference", *extra])


@pytest.mark.parametrize("loss_type", ["sequence-wise", "token-wise"])
def test_tiny_reward_model_training_raises_held_out_accuracy(tmp_path, tiny_model_dir, loss_type):
    results = run(tmp_path, tiny_model_dir, "--max_steps", "30", "--loss_type", loss_type, "--eval_steps", "0",
                  "--logging_steps", "10")
    assert results["eval/accuracy"] > results["start_eval/accuracy"] + 0.15
    assert results["eval/chosen_score"] > results["eval/rejected_score"]
    rows = read_metrics(tmp_path / "out")
    assert {"loss", "accuracy"} <= set(rows[1]) and "eval/score_histogram" in rows[-1]
    assert os.path.exists(tmp_path / "out" / "model" / "score_normalizer.json")


def test_hh_rlhf_transcripts_train(tmp_path, tiny_model_dir):
    run_reward.main([RM_CONFIG, "--model_name_or_path", tiny_model_dir, "--output_dir", str(tmp_path / "out"),
                     "--disable_tqdm", "--train_datasets", f"hh-rlhf:1.0:{REPO}/data/hh_rlhf_sample",
                     "--eval_datasets", "", "--max_steps", "3", "--logging_steps", "1"])
    assert [r["step"] for r in read_metrics(tmp_path / "out")] == [1, 2, 3]


@pytest.mark.parametrize("row, fragment", [
    ({"response_1": "Same answer."}, "identical"),
    ({"response_0": ""}, "response_0"),
    ({"better_response_id": None}, "better_response_id"),
])
def test_bad_preference_rows_fail_with_file_and_line(tmp_path, tiny_model_dir, capsys, row, fragment):
    good = {"prompt": "Q?", "response_0": "Same answer.", "response_1": "Other.", "better_response_id": 0,
            "safer_response_id": 0, "is_response_0_safe": True, "is_response_1_safe": True}
    bad = {**good, **row}
    if row.get("better_response_id", 0) is None:
        del bad["better_response_id"]
    path = tmp_path / "pairs.jsonl"
    path.write_text(json.dumps(good) + "\n" + json.dumps(bad) + "\n")
    with pytest.raises(SystemExit) as info:
        run(tmp_path, tiny_model_dir, "--train_datasets", f"PKU-SafeRLHF/train:1.0:{path}")
    err = capsys.readouterr().err
    assert info.value.code == 2 and "pairs.jsonl line 2" in err and fragment in err, err
    assert not (tmp_path / "out").exists()
