"""Sharding stages 2 and 3 (Paddle's group_sharded classes; on CPU through alignment/parallel/cpu_standins.py) on 2
and 4 gloo processes against one process on the same global batch, with the tolerances of tests/parallel/test_layouts.py
(every logged metric within 1e-5 relative, every final weight within 1e-5 of its tensor's largest magnitude):
SFT, the reward model and DPO, PPO (gae: policy and critic sharded, the policy generating from a whole copy under
stage 3) and RLOO, combined with tensor and data parallelism, with LoRA, with offload of the sharded optimizer
states; checkpoints resumed from stage 3 in one process and back; and a rank killed with SIGKILL mid-step. Marked
`parallel`; `python -m pytest -m parallel -n 0 -q -s tests/parallel/test_sharding.py` prints the worst difference of
each case.

sharding_segment_size 1000 splits every matrix of the tiny model (the smallest has 8192 elements) and leaves the
norms whole, so stage 3 slices what it would slice in a real model.
"""
import glob
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
from safetensors.numpy import load_file

from alignment.models import LlamaForCausalLM
from tests.helpers import REPO, read_metrics
from tests.parallel.test_layouts import one_process_rl  # noqa: F401  the one-process PPO and RLOO runs (a fixture)
from tests.parallel.test_layouts import (keep_steps, launch, processes_naming, resume_across, rl_run_matches,
                                stage_args, stage_run_matches, worst_relative_difference)

pytestmark = pytest.mark.parallel

SLICE_ALL = ["--sharding_segment_size", "1000"]
SLICED = "sharding stage3: 30 of 39 parameter tensors (99.9% of the elements) split over 2 ranks"  # the tiny LM
STAGE_LAYOUTS = [  # (stage, layout name, processes, flags, data degree, line the log must hold)
    ("sft", "stage3-sharding2", 2, ["--sharding", "stage3", *SLICE_ALL], 2, SLICED),
    ("rm", "stage2-tp2xsharding2", 4, ["--tensor_parallel_degree", "2", "--sharding", "stage2"], 2,
     "sharding stage2: the gradients and AdamW states of 39 trained parameter tensors split over 2 ranks"),
    ("dpo", "stage3-sharding2xdp2", 4, ["--sharding", "stage3", "--sharding_parallel_degree", "2", *SLICE_ALL], 4,
     SLICED),
    ("sft", "stage3-tp2xsharding2xdp2", 8, ["--tensor_parallel_degree", "2", "--sharding", "stage3",
                                            "--sharding_parallel_degree", "2", *SLICE_ALL], 4,
     "world 8 = tensor 2 x pipeline 1 x sharding 2 (stage3) x data 2"),
]


@pytest.mark.parametrize("stage, layout, processes, flags, data_degree, line", STAGE_LAYOUTS,
                         ids=[f"{case[0]}-{case[1]}" for case in STAGE_LAYOUTS])
def test_supervised_stages_under_sharding_stages_equal_one_process(tiny_model_dir, tiny_reward_dir, tmp_path, stage,
                                                                   layout, processes, flags, data_degree, line):
    """3 steps of 2 micro-batches of 4 (per process 4 / data degree) and an evaluation, as in test_layouts.py."""
    assert line in stage_run_matches(tmp_path, (tiny_model_dir, tiny_reward_dir), stage, layout, processes, flags,
                                     data_degree)


def test_lora_under_stage3_trains_the_adapters_of_one_process(tiny_model_dir, tmp_path):
    """LoRA SFT: stage 3 slices the frozen base weights as well; the adapters train as in one process."""
    lora = ["--lora", "true", "--lora_rank", "4", "--lora_alpha", "8"]
    common = stage_args("sft", tiny_model_dir) + lora
    subprocess.run([sys.executable, *common, "--per_device_train_batch_size", "4", "--output_dir",
                    str(tmp_path / "one")], cwd=REPO, check=True, capture_output=True)
    logs = launch(tmp_path / "logs", common + ["--sharding", "stage3", *SLICE_ALL, "--per_device_train_batch_size",
                                               "2", "--output_dir", str(tmp_path / "stage3")], 2)
    assert "parameter tensors" in logs and "split over 2 ranks" in logs
    worst_relative_difference(tmp_path / "one", tmp_path / "stage3", ("loss", "grad_norm", "eval/loss"), [])
    one = load_file(str(tmp_path / "one" / "model" / "adapter_model.safetensors"))
    sharded = load_file(str(tmp_path / "stage3" / "model" / "adapter_model.safetensors"))
    assert sorted(one) == sorted(sharded) and any("lora_B" in name for name in one)
    for name, value in one.items():
        assert np.abs(sharded[name] - value).max() <= 1e-5 * np.abs(value).max(), name
    assert max(np.abs(v).max() for name, v in one.items() if "lora_B" in name) > 0  # the adapters trained


RL_LAYOUTS = [  # (estimator, layout name, processes, flags, data degree)
    ("gae", "stage3-tp2xsharding2", 4, ["--tensor_parallel_degree", "2", "--sharding", "stage3", *SLICE_ALL], 2),
    ("rloo", "stage2-sharding2", 2, ["--sharding", "stage2"], 2),
    ("gae", "stage3-sharding2-offload", 2, ["--sharding", "stage3", *SLICE_ALL, "--offload_level",
                                            "freeze_model optimizer train_model"], 2),
]


@pytest.mark.parametrize("estimator, layout, processes, flags, data_degree", RL_LAYOUTS,
                         ids=[f"{case[0]}-{case[1]}" for case in RL_LAYOUTS])
def test_rl_under_sharding_stages_equals_one_process(one_process_rl, tiny_model_dir, tiny_reward_dir, tmp_path,
                                                     estimator, layout, processes, flags, data_degree):
    _, logs = rl_run_matches(one_process_rl[estimator], tmp_path, (tiny_model_dir, tiny_reward_dir), estimator,
                             layout, processes, flags, data_degree)
    assert f"policy: sharding {layout[:6]}" in logs


STAGE3 = (2, ["--sharding", "stage3", *SLICE_ALL], 2)  # (processes, flags, data degree)


@pytest.mark.parametrize("saved_under, resumed_under", [(STAGE3, None), (None, STAGE3)],
                         ids=["stage3-to-one", "one-to-stage3"])
def test_a_checkpoint_resumes_across_stage3_and_one_process(tiny_model_dir, tiny_reward_dir, tmp_path, saved_under,
                                                            resumed_under):
    """checkpoint-2 of a 4-step PPO run (policy and critic: whole weights, AdamW moments gathered from the slices)
    resumed under the other layout gives steps 3-4 and final weights equal to the run that never stopped."""
    metrics, weights = resume_across(tmp_path, tiny_model_dir, tiny_reward_dir, saved_under, resumed_under)
    print(f"\n{'stage3' if saved_under else 'one'} -> {'stage3' if resumed_under else 'one'}: worst relative "
          f"difference: metrics {metrics:.1e}, weights {weights:.1e}")


def _rank_pid(text: str, rank: int):
    """The PID of the worker of `rank` among the processes whose command line holds `text`."""
    for pid in processes_naming(text):
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                if f"PADDLE_TRAINER_ID={rank}".encode() in f.read().split(b"\0"):
                    return pid
        except OSError:
            continue
    return None


def test_one_rank_killed_mid_step_stops_the_launch_and_auto_resume_ends_as_the_straight_run(tiny_model_dir, tmp_path):
    """SFT under stage 3 over 2 processes, saving every 2 steps: rank 1 is SIGKILLed during step 5 (after
    checkpoint-4 is complete); the launch exits with an error instead of hanging, and `resume_from_checkpoint auto`
    ends with the metrics and weights of the run that was never stopped."""
    args = stage_args("sft", tiny_model_dir) + ["--max_steps", "6", "--save_steps", "2", "--eval_steps", "0",
                                                "--per_device_train_batch_size", "2", "--sharding", "stage3",
                                                *SLICE_ALL]
    launch(tmp_path / "logs-straight", args + ["--output_dir", str(tmp_path / "straight")], 2)
    out = tmp_path / "killed"
    cmd = [sys.executable, "-m", "paddle.distributed.launch", "--nproc_per_node", "2", "--log_dir",
           str(tmp_path / "logs"), *args, "--output_dir", str(out)]
    launcher = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline, victim = time.time() + 600, None
    while victim is None and launcher.poll() is None and time.time() < deadline:
        if (out / "latest").exists() and (out / "latest").read_text().strip() == "checkpoint-4":
            time.sleep(0.3)  # into step 5 (a step takes about a second here)
            victim = _rank_pid(str(out), 1)
        time.sleep(0.005)
    assert victim is not None, "the run ended before checkpoint-4 could be seen"
    os.kill(victim, signal.SIGKILL)
    started = time.time()
    code = launcher.wait(timeout=300)
    assert code != 0
    print(f"\nthe launch stopped {time.time() - started:.1f} s after the kill, exit code {code}")
    assert not (out / "model").exists() and [r["step"] for r in read_metrics(out) if "loss" in r][-1] < 6
    launch(tmp_path / "logs-resumed", args + ["--output_dir", str(out), "--resume_from_checkpoint", "auto"], 2)
    assert [r["step"] for r in read_metrics(out) if "loss" in r] == [1, 2, 3, 4, 5, 6]  # none lost or repeated
    assert "resumed from" in "".join(open(f).read() for f in glob.glob(str(tmp_path / "logs-resumed" / "workerlog.*")))
    keep_steps(tmp_path / "straight", tmp_path / "straight-5-6", 5, ("model",))
    keep_steps(out, tmp_path / "resumed-5-6", 5, ("model",))
    worst_relative_difference(tmp_path / "straight-5-6", tmp_path / "resumed-5-6", ("loss", "grad_norm"),
                              [("model", LlamaForCausalLM)])


def test_paddlenlps_rm_file_runs_its_sharding_stage2_over_four_processes(tiny_model_dir, tmp_path):
    """PaddleNLP's llm/config/llama/rm_argument.json asks for sharding stage2 with sharding_parallel_degree 4; on 4
    processes it now runs as written (it was refused: stage 2 'needs a GPU/XPU device')."""
    out = tmp_path / "out"
    logs = launch(tmp_path / "logs", [
        os.path.join(REPO, "alignment", "rm", "run_reward.py"),
        os.path.join(REPO, "tests", "fixtures", "paddlenlp", "rm_argument.json"), "--model_name_or_path",
        tiny_model_dir, "--train_datasets", f"PKU-SafeRLHF/train:1.0:{REPO}/data/preference", "--eval_datasets", "",
        "--output_dir", str(out), "--max_steps", "2"], 4)
    assert "world 4 = tensor 1 x pipeline 1 x sharding 4 (stage2) x data 1" in logs
    assert "sharding stage2: the gradients and AdamW states of 39 trained parameter tensors split over 4 ranks" in logs
    assert [r["step"] for r in read_metrics(out) if "loss" in r] == [1, 2] and (out / "model").is_dir()
