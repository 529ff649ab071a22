"""Distillation under launched layouts (marked `parallel`): the teacher scores on the training ranks, so a run with
one training and one rollout rank (max_staleness 0) trains as the one-process run; two data ranks, tensor
parallelism (the full-vocabulary loss over gathered logits, the teacher whole on every rank) and pipeline
parallelism (the sampled-token advantage) match one process within float rounding."""
import os

import numpy as np
import pytest
from safetensors.numpy import load_file

from tests.helpers import REPO, read_metrics
from tests.ppo.test_async_runs import comparable, launch as launch_two
from tests.parallel.test_layouts import launch

pytestmark = pytest.mark.parallel
SCRIPT = os.path.join(REPO, "alignment", "ppo", "run_distill.py")


@pytest.fixture(scope="module", autouse=True)
def one_mkl_thread_in_every_process():
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("MKL_NUM_THREADS", "1")
        yield


def args(out, student, teacher, loss, data_degree=1, *extra):
    return [SCRIPT, "--actor_model_name_or_path", student, "--teacher_model_name_or_path", teacher,
            "--output_dir", str(out), "--disable_tqdm", "--train_datasets",
            f"prompt-only:1.0:{REPO}/data/prompts/train.jsonl", "--max_steps", "3", "--max_new_tokens", "8",
            "--per_device_prompt_batch_size", str(4 // data_degree), "--per_device_train_batch_size",
            str(4 // data_degree), "--logging_steps", "1", "--learning_rate", "0.02", "--adam_epsilon", "1.0",  # as test_layouts: an
            "--distill_loss", loss, "--seed", "3", *extra]  # update proportional to the gradient, not its sign


def weights(out):
    return load_file(os.path.join(str(out), "policy", "model.safetensors"))


def run_one_process(out, *argv):
    import subprocess
    import sys

    done = subprocess.run([sys.executable, *argv], cwd=REPO, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]


def test_async_rollout_rank_with_the_teacher_on_the_training_rank_equals_one_process(tmp_path, tiny_model_dir,
                                                                                     tiny_teacher_dir):
    run_one_process(tmp_path / "one", *args(tmp_path / "one", tiny_model_dir, tiny_teacher_dir, "sampled_kl"))
    launch_two(tmp_path / "log", args(tmp_path / "two", tiny_model_dir, tiny_teacher_dir, "sampled_kl", 1,
                                      "--rollout_ranks", "1"))
    assert comparable(tmp_path / "one") == comparable(tmp_path / "two")
    one, two = weights(tmp_path / "one"), weights(tmp_path / "two")
    assert all(np.array_equal(one[k], two[k]) for k in one)
    assert all("distill/reverse_kl" in row for row in read_metrics(tmp_path / "two"))


@pytest.mark.parametrize("layout,loss", [("data2", "jsd"), ("tp2", "jsd"), ("pp2", "sampled_kl")])
def test_distillation_under_data_tensor_and_pipeline_parallelism_equals_one_process(tmp_path, tiny_model_dir,
                                                                                    tiny_teacher_dir, layout, loss):
    """The full-vocabulary loss (data, tensor parallel) and, under pipeline parallelism, the sampled-token
    advantage (the pipeline's default PPO loss carries it)."""
    data_degree = 2 if layout == "data2" else 1
    extra = {"tp2": ["--tensor_parallel_degree", "2"], "pp2": ["--pipeline_parallel_degree", "2"]}.get(layout, [])
    run_one_process(tmp_path / "one", *args(tmp_path / "one", tiny_model_dir, tiny_teacher_dir, loss))
    launch(tmp_path / "log", args(tmp_path / "two", tiny_model_dir, tiny_teacher_dir, loss, data_degree, *extra), 2)
    a, b = read_metrics(tmp_path / "one"), read_metrics(tmp_path / "two")
    keys = ("distill_loss",) if loss == "jsd" else ("actor_loss",)
    for x, y in zip(a, b):
        for key in keys + ("distill/reverse_kl", "distill/teacher_log_prob"):
            assert y[key] == pytest.approx(x[key], rel=1e-4, abs=1e-6), key
    one, two = weights(tmp_path / "one"), weights(tmp_path / "two")
    for key in one:
        assert np.abs(one[key] - two[key]).max() <= 1e-4 * max(np.abs(one[key]).max(), 1e-3), key
