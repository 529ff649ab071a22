"""load_best_model_at_end: the best evaluation's model becomes the final model."""
import os

import pytest

from alignment.sft import run_sft
from alignment.training.best_model import BestModel, greater_is_better, is_better, metric_key
from tests.helpers import REPO, read_metrics
from tests.training.test_resume import assert_same_weights, sft_args


def test_metric_names_and_directions_follow_hf():
    assert metric_key("accuracy") == metric_key("eval_accuracy") == metric_key("eval/accuracy") == "eval/accuracy"
    assert greater_is_better("eval/loss", None) is False and greater_is_better("eval/reward", None) is True
    assert greater_is_better("eval/loss", True) is True
    assert is_better(0.5, None, True) and is_better(0.6, 0.5, True) and not is_better(0.5, 0.5, True)
    assert is_better(0.4, 0.5, False) and not is_better(float("nan"), None, True)


def test_the_best_folder_replaces_the_final_one(tmp_path):
    best = BestModel(str(tmp_path), "loss", None)
    saves = []

    def save(folder):
        os.makedirs(os.path.join(folder, "model"), exist_ok=True)
        open(os.path.join(folder, "model", "weights"), "w").write(f"step {len(saves) + 1}")
        saves.append(folder)

    assert best.consider({"eval/loss": 2.0}, 1, save) and best.consider({"eval/loss": 1.0}, 2, save)
    assert not best.consider({"eval/loss": 1.5}, 3, save) and len(saves) == 2
    os.makedirs(tmp_path / "model")
    (tmp_path / "model" / "weights").write_text("step 3")
    assert best.restore(3, is_main=True) == "best model: step 2 (eval/loss 1); it is the final model"
    assert (tmp_path / "model" / "weights").read_text() == "step 2" and not (tmp_path / "best").exists()
    assert sorted(os.listdir(tmp_path)) == ["model"]
    with pytest.raises(ValueError, match="'eval/gold' is not among the evaluation metrics \\['eval/loss'\\]"):
        BestModel(str(tmp_path), "gold", None).consider({"eval/loss": 1.0}, 1, save)


def test_sft_keeps_the_model_of_its_best_evaluation(tmp_path, tiny_model_dir, capsys):
    out = tmp_path / "out"
    # greater_is_better with the loss: the worst (first) evaluation is "best", so the final model is not the last
    run_sft.main(sft_args(out, tiny_model_dir, "--eval_datasets", f"alpaca:1.0:{REPO}/data/sft/eval.jsonl",
                          "--eval_steps", "2", "--load_best_model_at_end", "true", "--metric_for_best_model",
                          "eval_loss", "--greater_is_better", "true"))
    evals = {row["step"]: row["eval/loss"] for row in read_metrics(out) if "eval/loss" in row}
    assert sorted(evals) == [2, 4, 6] and evals[2] > evals[6]
    best_step = max(evals, key=evals.get)
    assert best_step == 2 and "best model: step 2" in capsys.readouterr().out
    assert_same_weights(out / "model", out / f"checkpoint-{best_step}" / "model")
    assert not (out / "best").exists()


def test_best_model_selection_needs_evaluations(tmp_path, tiny_model_dir, capsys):
    with pytest.raises(SystemExit):
        run_sft.main(sft_args(tmp_path / "a", tiny_model_dir, "--load_best_model_at_end", "true", "--eval_steps", "0"))
    assert "'load_best_model_at_end' needs evaluations during training" in capsys.readouterr().err
    run_sft.main(sft_args(tmp_path / "b", tiny_model_dir, "--load_best_model_at_end", "true", "--max_steps", "1"))
    assert "no evaluation data, so the final model is the last step's" in capsys.readouterr().out
