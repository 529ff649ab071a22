"""Exact resume after a kill, crash-safe checkpoints and the NaN/inf step guard."""
import json
import os
import shutil
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
from safetensors.numpy import load_file

from alignment.ppo import run_ppo
from alignment.sft import run_sft
from alignment.training import checkpointing
from tests.helpers import REPO, read_metrics

PPO_CONFIG = os.path.join(REPO, "config", "tiny", "ppo_argument.json")
SFT_CONFIG = os.path.join(REPO, "config", "tiny", "sft_argument.json")


def ppo_args(out, actor, reward, *extra):
    return [PPO_CONFIG, "--actor_model_name_or_path", actor, "--reward_model_name_or_path", reward,
            "--output_dir", str(out), "--disable_tqdm", "--train_datasets",
            f"prompt-only:1.0:{REPO}/data/prompts/train.jsonl", "--eval_datasets", "", "--max_steps", "6",
            "--max_new_tokens", "8", "--per_device_prompt_batch_size", "4", "--per_device_train_batch_size", "2",
            "--logging_steps", "1", "--save_steps", "3", "--lr_scheduler_type", "cosine",
            "--critic_lr_scheduler_type", "cosine", "--normalize_reward", "true", *extra]


def sft_args(out, model, *extra):
    return [SFT_CONFIG, "--model_name_or_path", model, "--output_dir", str(out), "--disable_tqdm",
            "--train_datasets", f"alpaca:1.0:{REPO}/data/sft/train.jsonl", "--eval_datasets", "",
            "--max_steps", "6", "--logging_steps", "1", "--save_steps", "2", "--per_device_train_batch_size", "4",
            *extra]


def without_times(rows):
    return [{k: v for k, v in row.items() if not k.startswith("time/") and k != "tokens_per_sec"} for row in rows]


def assert_same_weights(dir_a, dir_b):
    a, b = load_file(os.path.join(dir_a, "model.safetensors")), load_file(os.path.join(dir_b, "model.safetensors"))
    assert a.keys() == b.keys()
    for key in a:
        np.testing.assert_array_equal(a[key], b[key], err_msg=key)  # bitwise


def test_ppo_killed_after_a_checkpoint_resumes_to_the_same_losses_and_weights(tmp_path, tiny_model_dir,
                                                                              tiny_reward_dir):
    straight = tmp_path / "straight"
    run_ppo.main(ppo_args(straight, tiny_model_dir, tiny_reward_dir))
    # normalize_reward: the running statistics the checkpoint keeps are those of every reward of steps 1-3
    # (4 prompts x 1 answer each), whose batch means the log holds
    stats = json.load(open(straight / "checkpoint-3" / "trainer_state.json"))["reward_stats"]
    means = [r["reward/mean"] for r in read_metrics(straight)[:3]]
    assert stats["count"] == 12 and stats["mean"] == pytest.approx(float(np.mean(means)), rel=1e-5, abs=1e-7)

    killed = tmp_path / "killed"
    script = os.path.join(REPO, "alignment", "ppo", "run_ppo.py")
    proc = subprocess.Popen([sys.executable, script, *ppo_args(killed, tiny_model_dir, tiny_reward_dir)[0:]],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 300
    while not (killed / "latest").exists() and proc.poll() is None and time.time() < deadline:
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert (killed / "latest").read_text().strip() == "checkpoint-3"

    run_ppo.main(ppo_args(killed, tiny_model_dir, tiny_reward_dir, "--resume_from_checkpoint", "auto"))
    assert [r["step"] for r in read_metrics(killed)] == [1, 2, 3, 4, 5, 6]
    assert without_times(read_metrics(killed)) == without_times(read_metrics(straight))
    assert_same_weights(straight / "policy", killed / "policy")
    assert_same_weights(straight / "value", killed / "value")


def test_a_kill_during_a_save_leaves_the_previous_checkpoint_for_auto_resume(tmp_path, tiny_model_dir,
                                                                             monkeypatch):
    straight = tmp_path / "straight"
    run_sft.main(sft_args(straight, tiny_model_dir))

    out = tmp_path / "out"
    real, saves = checkpointing.write_rng_state, []

    def killed_during_second_save(directory):
        saves.append(directory)
        if len(saves) == 2:
            raise KeyboardInterrupt("killed while writing checkpoint-4")
        real(directory)

    monkeypatch.setattr(checkpointing, "write_rng_state", killed_during_second_save)
    with pytest.raises(SystemExit) as stop:  # Ctrl-C mid-save: one line, exit 130 (alignment/exits.py)
        run_sft.main(sft_args(out, tiny_model_dir))
    assert stop.value.code == 130
    monkeypatch.undo()
    assert sorted(os.listdir(out)) == ["args.json", "checkpoint-2", "latest", "metrics.jsonl", "visualdl"]
    assert (out / "latest").read_text().strip() == "checkpoint-2"
    assert checkpointing.resolve_resume(str(out), "auto") == os.path.join(str(out), "checkpoint-2")

    run_sft.main(sft_args(out, tiny_model_dir, "--resume_from_checkpoint", "auto"))
    assert [r["step"] for r in read_metrics(out)] == [1, 2, 3, 4, 5, 6]
    assert without_times(read_metrics(out)) == without_times(read_metrics(straight))
    assert_same_weights(straight / "model", out / "model")


def test_save_total_limit_keeps_the_newest_checkpoints(tmp_path, tiny_model_dir):
    run_sft.main(sft_args(tmp_path / "out", tiny_model_dir, "--save_steps", "1", "--save_total_limit", "2"))
    assert sorted(d for d in os.listdir(tmp_path / "out") if d.startswith("checkpoint-")) == \
        ["checkpoint-4", "checkpoint-5"]


def test_resume_from_a_path_that_is_not_a_checkpoint_is_a_clear_error(tmp_path, tiny_model_dir, capsys):
    with pytest.raises(SystemExit) as info:
        run_sft.main(sft_args(tmp_path / "out", tiny_model_dir, "--resume_from_checkpoint", str(tmp_path)))
    err = capsys.readouterr().err
    assert info.value.code == 2 and "resume_from_checkpoint" in err and "not a complete checkpoint" in err


def nan_on_steps(monkeypatch, steps):
    from alignment.sft.sft_trainer import SupervisedTrainer

    real, calls = SupervisedTrainer.compute_loss, []

    def compute_loss(self, batch):
        calls.append(1)
        loss, metrics, weight = real(self, batch)
        return (loss * float("nan") if len(calls) in steps else loss), metrics, weight

    monkeypatch.setattr(SupervisedTrainer, "compute_loss", compute_loss)


def test_nan_steps_are_skipped_and_counted(tmp_path, tiny_model_dir, monkeypatch):
    nan_on_steps(monkeypatch, {2, 3})
    run_sft.main(sft_args(tmp_path / "out", tiny_model_dir, "--save_steps", "0"))
    rows = read_metrics(tmp_path / "out")
    assert [r["skipped_steps"] for r in rows] == [0, 1, 2, 2, 2, 2]
    assert np.isnan(rows[1]["loss"]) and np.isfinite(rows[3]["loss"])
    weights = load_file(str(tmp_path / "out" / "model" / "model.safetensors"))
    assert all(np.isfinite(w).all() for w in weights.values())


def test_too_many_nan_steps_in_a_row_stop_the_run_keeping_the_last_checkpoint(tmp_path, tiny_model_dir,
                                                                              monkeypatch, capsys):
    nan_on_steps(monkeypatch, {2, 3, 4})
    with pytest.raises(SystemExit) as info:
        run_sft.main(sft_args(tmp_path / "out", tiny_model_dir, "--max_nonfinite_steps", "3"))
    err = capsys.readouterr().err
    assert info.value.code == 1 and "3 steps in a row" in err and "max_nonfinite_steps" in err, err
    assert (tmp_path / "out" / "latest").read_text().strip() == "checkpoint-2"
    assert not (tmp_path / "out" / "model").exists()


def test_reward_model_resume_restores_weights_optimizer_and_normalizer(tmp_path, tiny_model_dir):
    from alignment.rm import run_reward

    def rm_args(out, *extra):
        return [os.path.join(REPO, "config", "tiny", "rm_argument.json"), "--model_name_or_path", tiny_model_dir,
                "--output_dir", str(out), "--disable_tqdm", "--eval_datasets", "", "--max_steps", "4",
                "--logging_steps", "1", "--save_steps", "2", "--per_device_train_batch_size", "4",
                "--normalize_score_during_training", "true", "--normalizer_type", "ExponentialMovingAverage", *extra]

    straight = tmp_path / "straight"
    run_reward.main(rm_args(straight))
    resumed = tmp_path / "resumed"
    resumed.mkdir()
    shutil.copytree(straight / "checkpoint-2", resumed / "checkpoint-2")
    (resumed / "metrics.jsonl").write_text("".join(line for line in open(straight / "metrics.jsonl")
                                                   if json.loads(line)["step"] <= 2))
    run_reward.main(rm_args(resumed, "--resume_from_checkpoint", "auto"))
    assert without_times(read_metrics(resumed)) == without_times(read_metrics(straight))
    assert_same_weights(straight / "model", resumed / "model")
    normalizer = json.load(open(straight / "model" / "score_normalizer.json"))
    assert normalizer["count"] > 0 and json.load(open(resumed / "model" / "score_normalizer.json")) == normalizer
