"""Data parallelism: 2 processes under `python -m paddle.distributed.launch` (gloo on CPU)."""
import json
import os
import subprocess
import sys

import numpy as np

from alignment.models import LlamaForCausalLM
from tests.helpers import REPO, read_metrics

SFT = [os.path.join(REPO, "alignment", "sft", "run_sft.py"), os.path.join(REPO, "config", "tiny", "sft_argument.json")]


def launch(tmp_path, args, nproc=2):
    cmd = [sys.executable, "-m", "paddle.distributed.launch", "--nproc_per_node", str(nproc),
           "--log_dir", str(tmp_path / "logs"), *args]
    done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300)
    logs = "".join(open(tmp_path / "logs" / f).read() for f in sorted(os.listdir(tmp_path / "logs"))
                   if f.startswith("workerlog"))
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:] + logs[-3000:]


def test_two_process_sft_equals_one_process_with_the_global_batch(tmp_path, tiny_model_dir):
    """2 x 4 samples with averaged gradients == 8 samples in one process (equal answer lengths, so the
    per-rank token means average to the global token mean; adam_epsilon 1 makes updates linear in the gradient)."""
    data = tmp_path / "same.jsonl"
    words = ["red", "blue", "green", "black", "white", "brown", "pink", "grey", "gold", "teal", "navy", "plum"]
    data.write_text("".join(json.dumps({"instruction": f"Is {w} a colour?", "output": "Yes, it is."}) + "\n"
                            for w in words))
    common = ["--model_name_or_path", tiny_model_dir, "--train_datasets", f"alpaca:1.0:{data}", "--eval_datasets", "",
              "--max_steps", "3", "--warmup_steps", "0", "--lr_scheduler_type", "constant", "--adam_epsilon", "1.0",
              "--disable_tqdm", "--logging_steps", "1"]
    launch(tmp_path, SFT + common + ["--per_device_train_batch_size", "4", "--output_dir", str(tmp_path / "two")])
    subprocess.run([sys.executable, *SFT, *common, "--per_device_train_batch_size", "8", "--output_dir",
                    str(tmp_path / "one")], cwd=REPO, check=True, capture_output=True)
    two, one = read_metrics(tmp_path / "two"), read_metrics(tmp_path / "one")
    np.testing.assert_allclose([r["loss"] for r in two], [r["loss"] for r in one], rtol=1e-6)
    a = LlamaForCausalLM.from_pretrained(str(tmp_path / "one" / "model"))
    b = LlamaForCausalLM.from_pretrained(str(tmp_path / "two" / "model"))
    start = LlamaForCausalLM.from_pretrained(tiny_model_dir)
    moved = 0.0
    for (name, x), y, z in zip(a.named_parameters(), b.parameters(), start.parameters()):
        np.testing.assert_allclose(x.numpy(), y.numpy(), atol=1e-7, err_msg=name)
        moved = max(moved, float(np.abs(x.numpy() - z.numpy()).max()))
    assert moved > 1e-4  # training really moved the weights


def test_two_process_grpo_runs_and_rank_zero_writes(tmp_path, tiny_model_dir):
    out = tmp_path / "out"
    launch(tmp_path, [os.path.join(REPO, "alignment", "ppo", "run_ppo.py"),
                      os.path.join(REPO, "config", "tiny", "grpo_argument.json"),
                      "--actor_model_name_or_path", tiny_model_dir, "--train_datasets",
                      f"prompt-only:1.0:{REPO}/data/prompts/train.jsonl", "--eval_datasets", "", "--max_steps", "2",
                      "--max_new_tokens", "8", "--output_dir", str(out), "--disable_tqdm"])
    assert [r["step"] for r in read_metrics(out)] == [1, 2]
    assert (out / "policy" / "model.safetensors").exists()


def test_two_process_dpo_equals_one_process_with_the_global_batch(tmp_path, tiny_model_dir):
    """The DPO loss is a mean over pairs, so 2 x 4 pairs with averaged gradients == 8 pairs in one process."""
    dpo = [os.path.join(REPO, "alignment", "dpo", "run_dpo.py"), os.path.join(REPO, "config", "tiny",
                                                                               "dpo_argument.json")]
    common = ["--model_name_or_path", tiny_model_dir, "--train_datasets",
              f"PKU-SafeRLHF/train:1.0:{REPO}/data/preference", "--eval_datasets", "", "--max_steps", "2",
              "--warmup_steps", "0", "--lr_scheduler_type", "constant", "--disable_tqdm", "--logging_steps", "1",
              "--adam_epsilon", "1.0"]  # updates linear in the gradient: float noise is not blown up to lr size
    launch(tmp_path, dpo + common + ["--per_device_train_batch_size", "4", "--output_dir", str(tmp_path / "two")])
    subprocess.run([sys.executable, *dpo, *common, "--per_device_train_batch_size", "8", "--output_dir",
                    str(tmp_path / "one")], cwd=REPO, check=True, capture_output=True)
    two, one = read_metrics(tmp_path / "two"), read_metrics(tmp_path / "one")
    # the margin is beta (0.1) x a signed sum of four sequence log-prob sums of some -100s (chosen and rejected, policy
    # and reference): float32 keeps each to ~1e-5, so its atol is 4e-6 (1 against 2 MKL threads per process sum the
    # GEMMs in other orders)
    for key, atol in (("loss", 1e-7), ("rewards/margin", 4e-6), ("rewards/accuracy", 1e-7)):
        np.testing.assert_allclose([r[key] for r in two], [r[key] for r in one], rtol=1e-5, atol=atol, err_msg=key)
    assert two[1]["rewards/margin"] != 0.0  # the first step moved the policy away from the reference
    a = LlamaForCausalLM.from_pretrained(str(tmp_path / "one" / "model"))
    b = LlamaForCausalLM.from_pretrained(str(tmp_path / "two" / "model"))
    for (name, x), y in zip(a.named_parameters(), b.parameters()):
        np.testing.assert_allclose(x.numpy(), y.numpy(), atol=1e-7, err_msg=name)


def test_a_rank_killed_by_a_signal_says_where_its_python_threads_were(tmp_path):
    cmd = [sys.executable, "-m", "paddle.distributed.launch", "--nproc_per_node", "2", "--log_dir",
           str(tmp_path / "logs"), os.path.join(REPO, "tests", "scripts", "crash_rank.py")]
    done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300)
    # the dying rank's C++ stack dump may hold bytes that are not UTF-8
    log = (tmp_path / "logs" / "workerlog.1").read_bytes().decode("utf-8", "replace")
    assert done.returncode != 0, log[-3000:]
    assert "Fatal Python error: Segmentation fault" in log and "in read_address_zero" in log, log[-3000:]
    assert "FatalError: `Segmentation fault`" in log  # then Paddle's own handler, as before
