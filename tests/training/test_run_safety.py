"""Checkpoints that are data (a crafted pickle runs nothing), `latest` confined to output_dir, resume falling back
past a damaged checkpoint, one run per output_dir, the guard on non-finite weights, and logging windows that
survive a resume."""
import json
import os
import pickle
import shutil
import subprocess
import sys
import time

import numpy as np
import pytest
from safetensors.numpy import load_file

from alignment.sft import run_sft
from alignment.training import checkpointing
from alignment.training.output_dir import release_output_dir
from alignment.fileio import atomic_directory
from tests.helpers import REPO, read_metrics
from tests.training.test_resume import assert_same_weights, sft_args, without_times


class WritesAFile:
    """A pickle payload: unpickling it calls os.system, which would create the file it names."""

    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return os.system, (f"touch {self.path}",)


def test_a_crafted_pickle_in_a_checkpoint_runs_nothing(tmp_path, tiny_model_dir, capsys):
    out = tmp_path / "out"
    run_sft.main(sft_args(out, tiny_model_dir, "--max_steps", "3"))
    marker = tmp_path / "pwned"
    checkpoint = out / "checkpoint-2"
    for name in ("rng_state.pkl", "model.optimizer", "model.scheduler"):  # what earlier versions unpickled
        with open(checkpoint / name, "wb") as f:
            pickle.dump(WritesAFile(marker), f)
    with pytest.raises(SystemExit) as stop:  # files the manifest does not list: refused, not skipped over
        run_sft.main(sft_args(out, tiny_model_dir, "--max_steps", "4", "--resume_from_checkpoint", "auto"))
    err = capsys.readouterr().err
    assert stop.value.code == 2 and err.count("\n") == 1
    assert "checkpoint-2: model.optimizer is not in its manifest.json" in err
    assert not marker.exists() and not (out / "checkpoint-4").exists()

    (checkpoint / "rng_state.json").unlink()  # now it looks like an earlier version's checkpoint
    with pytest.raises(SystemExit) as stop:
        run_sft.main(sft_args(tmp_path / "other", tiny_model_dir, "--resume_from_checkpoint", str(checkpoint)))
    err = capsys.readouterr().err
    assert stop.value.code == 2 and "earlier version" in err and "could run code" in err
    assert not marker.exists()


def test_a_pdparams_dropped_into_a_checkpoint_is_refused_unread(tmp_path, tiny_model_dir, capsys):
    """PaddleNLP's weight file beside our model's: from_pretrained would prefer it, so resume refuses the
    checkpoint before any model is loaded (and the file could not run code anyway:
    tests/repo/test_no_code_loading.py)."""
    out = tmp_path / "out"
    run_sft.main(sft_args(out, tiny_model_dir, "--max_steps", "3"))
    marker = tmp_path / "pwned"
    with open(out / "checkpoint-2" / "model" / "model_state.pdparams", "wb") as f:
        pickle.dump({"llama.norm.weight": WritesAFile(marker)}, f)
    with pytest.raises(SystemExit) as stop:
        run_sft.main(sft_args(out, tiny_model_dir, "--max_steps", "4", "--resume_from_checkpoint", "auto"))
    err = capsys.readouterr().err
    assert stop.value.code == 2 and "model/model_state.pdparams is not in its manifest.json" in err
    assert not marker.exists() and not (out / "checkpoint-4").exists()


def test_latest_pointing_outside_the_output_dir_is_not_followed(tmp_path, tiny_model_dir, capsys):
    elsewhere = tmp_path / "elsewhere"
    run_sft.main(sft_args(elsewhere, tiny_model_dir, "--max_steps", "4"))
    out = tmp_path / "out"
    run_sft.main(sft_args(out, tiny_model_dir, "--max_steps", "3"))
    for pointer in (str(elsewhere / "checkpoint-4"), "../elsewhere/checkpoint-4", "checkpoint-4/../../elsewhere"):
        (out / "latest").write_text(pointer + "\n")
        assert checkpointing.resolve_resume(str(out), "auto") == str(out / "checkpoint-2")
        assert "ignoring" in capsys.readouterr().out


def test_resume_auto_skips_a_damaged_newest_checkpoint_and_says_so(tmp_path, tiny_model_dir, capsys):
    out = tmp_path / "out"
    run_sft.main(sft_args(out, tiny_model_dir))  # checkpoints 2 and 4
    weights = out / "checkpoint-4" / "model" / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-5] ^= 0xFF  # one flipped byte, same size
    weights.write_bytes(bytes(data))
    capsys.readouterr()
    assert checkpointing.resolve_resume(str(out), "auto") == str(out / "checkpoint-2")
    said = capsys.readouterr().out
    assert "skipping" in said and "checkpoint-4" in said and "model/model.safetensors does not match" in said


def test_a_replacement_cut_between_its_two_renames_is_undone(tmp_path):
    target = tmp_path / "model"
    target.mkdir()
    (target / "weights").write_text("old")
    aside = tmp_path / ".model.tmp-old-x"  # what a kill between `path -> aside` and `new -> path` leaves
    aside.mkdir()
    os.rename(target, aside / "model")
    with atomic_directory(str(target)) as tmp:
        assert (target / "weights").read_text() == "old"  # put back before anything was deleted
        (tmp_path / tmp / "weights").write_text("new")
    assert (target / "weights").read_text() == "new" and not aside.exists()


def test_two_runs_into_one_output_dir_the_second_exits_at_once_naming_the_first(tmp_path, tiny_model_dir):
    out = tmp_path / "out"
    script = os.path.join(REPO, "alignment", "sft", "run_sft.py")
    first = subprocess.Popen([sys.executable, script, *sft_args(out, tiny_model_dir, "--max_steps", "400",
                                                                 "--save_steps", "0")],
                             cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.time() + 120
        while not (out / "args.json").exists() and time.time() < deadline:
            time.sleep(0.1)
        started = time.time()
        second = subprocess.run([sys.executable, script, *sft_args(out, tiny_model_dir, "--max_steps", "2",
                                                                   "--resume_from_checkpoint", "auto")],
                                cwd=REPO, capture_output=True, text=True, timeout=120)
        assert second.returncode == 2
        assert f"pid {first.pid} on" in second.stderr and "in use by another run" in second.stderr
        assert time.time() - started < 30  # before any model or data is loaded
        assert first.poll() is None  # the first run goes on
    finally:
        first.kill()
        first.wait()
    # a killed run's lock is free again: auto-resume (nothing saved yet) starts afresh
    run_sft.main(sft_args(out, tiny_model_dir, "--max_steps", "2", "--resume_from_checkpoint", "auto"))
    assert [r["step"] for r in read_metrics(out)] == [1, 2]


def test_an_update_that_makes_weights_non_finite_stops_before_saving(tmp_path, tiny_model_dir, capsys):
    """3e38 is a finite float, but AdamW's first update moves weights by about lr: past float32's range."""
    out = tmp_path / "out"
    with pytest.raises(SystemExit) as stop:
        run_sft.main(sft_args(out, tiny_model_dir, "--learning_rate", "3e38", "--warmup_steps", "0",
                              "--lr_scheduler_type", "constant", "--save_steps", "1"))
    err = capsys.readouterr().err
    assert stop.value.code == 1 and "step 1: the update made weights NaN/inf" in err
    assert not out.exists() or os.listdir(out) in ([".run.lock"], [".run.lock", "args.json"])  # nothing saved


@pytest.mark.parametrize("bad, expected", [(None, True), (float("nan"), False), (float("inf"), False),
                                           (-float("inf"), False), (3e20, True)])
def test_all_finite_weights_check(bad, expected):
    """The fast sum of squares says finite, or falls back to the exact check: 3e20 squares to inf in float32, yet
    it is a finite weight; NaN and +-inf anywhere are caught."""
    import paddle
    from alignment.training.guard import all_finite

    params = [paddle.ones([3, 4]), paddle.zeros([5]), paddle.full([2], 2.0, dtype="float64")]
    if bad is not None:
        values = np.ones([3, 4], dtype="float32")
        values[1, 2] = bad
        params[0] = paddle.to_tensor(values)
    assert all_finite(params) is expected
    assert all_finite([]) is True


def test_a_resumed_run_logs_the_same_windows_as_the_run_that_never_stopped(tmp_path, tiny_model_dir):
    """logging_steps 3 and save_steps 2: the row of step 3 averages steps 1-3 in both runs."""
    flags = ("--logging_steps", "3", "--save_steps", "2")
    straight = tmp_path / "straight"
    run_sft.main(sft_args(straight, tiny_model_dir, *flags))
    resumed = tmp_path / "resumed"
    resumed.mkdir()
    shutil.copytree(straight / "checkpoint-2", resumed / "checkpoint-2")
    run_sft.main(sft_args(resumed, tiny_model_dir, *flags, "--resume_from_checkpoint", "auto"))
    rows, expected = without_times(read_metrics(resumed)), without_times(read_metrics(straight))
    assert [r["step"] for r in rows] == [3, 6] and rows == expected
    assert_same_weights(straight / "model", resumed / "model")
    state = json.load(open(straight / "checkpoint-2" / "trainer_state.json"))
    assert len(state["log_window"]) == 2 and np.isfinite(state["log_window"][0]["loss"])
    files = json.load(open(straight / "checkpoint-2" / "manifest.json"))["files"]
    assert "model/model.safetensors" in files and "model.optimizer.safetensors" in files
    assert load_file(str(straight / "checkpoint-2" / "model.optimizer.safetensors"))


@pytest.mark.skipif(os.geteuid() != 0, reason="mounting a small tmpfs (a disk that fills up) needs root")
def test_a_full_disk_stops_the_run_with_one_line_and_the_last_checkpoint_loads(tmp_path, tiny_model_dir, capsys):
    """A 20 MiB filesystem holds one tiny checkpoint (12 MiB) but not the next: ENOSPC while writing checkpoint-4
    ends the run with exit 1 and a one-line message; checkpoint-2 still verifies and resumes."""
    disk = tmp_path / "disk"
    disk.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=20m", "tmpfs", str(disk)], check=True)
    try:
        out = disk / "out"
        with pytest.raises(SystemExit) as stop:
            run_sft.main(sft_args(out, tiny_model_dir, "--save_total_limit", "0"))
        err = capsys.readouterr().err.strip()
        assert stop.value.code == 1 and err.startswith("error: ") and len(err.splitlines()) == 1, err
        assert "No space left on device" in err and "intact" in err
        assert (out / "latest").read_text().strip() == "checkpoint-2"
        assert checkpointing.verify_checkpoint(str(out / "checkpoint-2")) is None
        assert not any(name.startswith(".checkpoint-4") for name in os.listdir(out))  # no half-written leftovers
    finally:
        release_output_dir(str(disk / "out"))  # the run's lock file is open until released
        subprocess.run(["umount", "--lazy", str(disk)], check=False)


@pytest.mark.parametrize("damage", ["truncated rng_state.json", "trainer_state.json without a counter"])
def test_a_damaged_checkpoint_file_given_explicitly_is_a_one_line_error(tmp_path, tiny_model_dir, capsys, damage):
    out = tmp_path / "out"
    run_sft.main(sft_args(out, tiny_model_dir, "--max_steps", "3"))
    checkpoint = out / "checkpoint-2"
    if damage.startswith("truncated"):
        text = (checkpoint / "rng_state.json").read_text()
        (checkpoint / "rng_state.json").write_text(text[: len(text) // 2])
        name = "rng_state.json"
    else:
        state = json.load(open(checkpoint / "trainer_state.json"))
        del state["batches_drawn"]
        (checkpoint / "trainer_state.json").write_text(json.dumps(state))
        name = "trainer_state.json"
    capsys.readouterr()
    with pytest.raises(SystemExit) as stop:
        run_sft.main(sft_args(tmp_path / "again", tiny_model_dir, "--resume_from_checkpoint", str(checkpoint)))
    err = capsys.readouterr().err.strip()
    assert stop.value.code == 2 and err.startswith("error: ") and len(err.splitlines()) == 1, err
    assert name in err and "resume_from_checkpoint" in err


def test_saved_models_and_checkpoints_are_readable_by_others_under_umask_022(tmp_path, tiny_model_dir):
    old = os.umask(0o022)
    try:
        run_sft.main(sft_args(tmp_path / "out", tiny_model_dir, "--max_steps", "3"))
    finally:
        os.umask(old)
    for path in (tmp_path / "out" / "model", tmp_path / "out" / "checkpoint-2",
                 tmp_path / "out" / "model" / "model.safetensors", tmp_path / "out" / "model" / "config.json",
                 tmp_path / "out" / "checkpoint-2" / "rng_state.json", tmp_path / "out" / "metrics.jsonl"):
        mode = os.stat(path).st_mode & 0o777
        assert mode & 0o044 == 0o044, f"{path}: mode {oct(mode)}"  # group and others may read
        assert not path.is_dir() or mode & 0o011 == 0o011, f"{path}: mode {oct(mode)}"  # and enter directories
