"""Combined layouts on 4 and 8 CPU processes (gloo) against one process on the same global batch: tensor x
pipeline x sharding x data parallel for PPO (gae) and a critic-free estimator (RLOO with GRPO's KL-in-loss), SFT,
the reward model and DPO each under a tensor/sharding/data and a pipeline layout, and checkpoints resumed under
another layout. Marked `parallel`. Each run's per-step losses, KL and rewards and its final weights must equal the
one-process run's within 1e-5 (relative); `python -m pytest -m parallel -n 0 -q -s tests/parallel/test_layouts.py`
prints the worst relative difference of each layout (the README's table; `-n 0`: xdist workers' prints are not shown).

The per-process batch is the global batch over the data degree (data parallel x sharding): 8 rollouts in
micro-batches of 4 with 2 accumulation steps in one process are 8/d per process in micro-batches of 4/d.
adam_epsilon 1 keeps AdamW's update linear in the gradient (see tests/parallel/test_parallel.py). The critic-free runs
use RLOO rather than GRPO: GRPO divides by the group's reward std (+1e-6), so a group of identical responses, whose
rewards tie exactly in one process and differ by float noise (1e-7) under another summation order, gets
advantages of 0 in one run and O(0.1) in the other; RLOO's advantages are continuous in the rewards.
"""
import glob
import json
import os
import shutil
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from alignment.models import LlamaForCausalLM
from alignment.models.score_model import ScoreModel
from tests.helpers import REPO, read_metrics

pytestmark = pytest.mark.parallel

RL_KEYS = ("actor_loss", "reward/mean", "reward/std", "kl", "entropy", "clip_frac", "approx_kl")
LAYOUTS = {  # name: (processes, flags, data degree)
    "tp2xpp2": (4, ["--tensor_parallel_degree", "2", "--pipeline_parallel_degree", "2"], 1),
    "tp2xsharding2": (4, ["--tensor_parallel_degree", "2", "--sharding", "stage1"], 2),
    "pp2xdp2": (4, ["--pipeline_parallel_degree", "2"], 2),
    "tp2xdp2": (4, ["--tensor_parallel_degree", "2"], 2),
    "tp2xpp2xdp2": (8, ["--tensor_parallel_degree", "2", "--pipeline_parallel_degree", "2"], 2),
    "tp2xpp2xsharding2": (8, ["--tensor_parallel_degree", "2", "--pipeline_parallel_degree", "2",
                              "--sharding", "stage1"], 2),
}


def launch(log_dir, args, nproc, timeout=900):
    cmd = [sys.executable, "-m", "paddle.distributed.launch", "--nproc_per_node", str(nproc), "--log_dir",
           str(log_dir), *args]
    done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=timeout)
    logs = "".join(open(os.path.join(log_dir, f)).read() for f in sorted(os.listdir(log_dir))
                   if f.startswith("workerlog"))
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:] + logs[-4000:]
    return logs


def rl_args(estimator, tiny_model_dir, tiny_reward_dir, data_degree, out):
    """3 steps of PPO (8 prompts, 1 response each) or RLOO (4 prompts, 2 responses each): 8 rollouts a step."""
    group = 1 if estimator == "gae" else 2
    args = [os.path.join(REPO, "alignment", "ppo", "run_ppo.py"), os.path.join(REPO, "config", "tiny",
                                                                               "ppo_argument.json"),
            "--actor_model_name_or_path", tiny_model_dir, "--reward_model_name_or_path", tiny_reward_dir,
            "--eval_datasets", "", "--max_steps", "3", "--max_new_tokens", "12", "--disable_tqdm",
            "--adam_epsilon", "1.0", "--learning_rate", "0.02", "--critic_learning_rate", "0.02",
            "--advantage_estimator", estimator, "--num_return_sequences", str(group),
            "--per_device_prompt_batch_size", str(8 // group // data_degree),
            "--per_device_train_batch_size", str(4 // data_degree), "--gradient_accumulation_steps", "2",
            "--output_dir", str(out)]
    if estimator != "gae":
        args += ["--kl_in_loss", "true", "--kl_estimator", "k3", "--update_iters", "1"]
    return args


def worst_relative_difference(one, other, keys, subdirs):
    """Checks every logged key of every step within rtol 1e-5 (atol 1e-6: values that are ~0 by construction, such
    as a first step's policy loss, have no meaningful relative difference) and every final weight tensor within
    1e-5 of its largest magnitude; returns (worst relative metric difference over values >= 1e-4, worst
    max|a - b| / max|a| over the weight tensors)."""
    a, b = read_metrics(one), read_metrics(other)
    assert [r["step"] for r in a] == [r["step"] for r in b]
    metrics = 0.0
    for key in keys:  # rows of training steps and of evaluations log different keys
        assert [key in r for r in a] == [key in r for r in b] and any(key in r for r in a), key
        x, y = np.array([r[key] for r in a if key in r]), np.array([r[key] for r in b if key in r])
        np.testing.assert_allclose(y, x, rtol=1e-5, atol=1e-6, err_msg=f"{key} (one process first)")
        big = np.abs(x) >= 1e-4
        if big.any():
            metrics = max(metrics, float(np.max(np.abs(x - y)[big] / np.abs(x)[big])))
    weights = 0.0
    for sub, cls in subdirs:
        for (name, x), y in zip(cls.from_pretrained(str(one / sub)).named_parameters(),
                                cls.from_pretrained(str(other / sub)).parameters()):
            x, y = x.numpy(), y.numpy()
            weights = max(weights, float(np.abs(x - y).max() / np.abs(x).max()))
            assert weights < 1e-5, f"{sub} {name}: max |difference| / max |weight| = {weights:.2e}"
    return metrics, weights


@pytest.fixture(scope="module")
def one_process_rl(tiny_model_dir, tiny_reward_dir, tmp_path_factory):
    runs = {}
    for estimator in ("gae", "rloo"):
        out = tmp_path_factory.mktemp(f"one-{estimator}") / "run"
        subprocess.run([sys.executable, *rl_args(estimator, tiny_model_dir, tiny_reward_dir, 1, out)], cwd=REPO,
                       check=True, capture_output=True)
        runs[estimator] = out
    return runs


def rl_run_matches(one_process_run, tmp_path, models, estimator, layout, processes, flags, data_degree):
    """The RL run of `estimator` (gae or rloo) under a layout against the one-process run: every logged metric and
    final weight within the tolerances; returns (its output directory, its logs). models: (actor, reward) dirs."""
    out = tmp_path / layout
    logs = launch(tmp_path / "logs", rl_args(estimator, *models, data_degree, out) + flags, processes)
    keys = RL_KEYS + (("critic_loss",) if estimator == "gae" else ())
    subdirs = [("policy", LlamaForCausalLM)] + ([("value", ScoreModel)] if estimator == "gae" else [])
    metrics, weights = worst_relative_difference(one_process_run, out, keys, subdirs)
    print(f"\n{estimator} {layout}: worst relative difference: metrics {metrics:.1e}, weights {weights:.1e}")
    return out, logs


@pytest.mark.parametrize("estimator", ["gae", "rloo"])
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_combined_layout_equals_one_process(one_process_rl, tiny_model_dir, tiny_reward_dir, tmp_path, layout,
                                            estimator):
    processes, flags, data_degree = LAYOUTS[layout]
    out, logs = rl_run_matches(one_process_rl[estimator], tmp_path, (tiny_model_dir, tiny_reward_dir), estimator,
                               layout, processes, flags, data_degree)
    assert f"world {processes} = " in logs
    start = LlamaForCausalLM.from_pretrained(tiny_model_dir)
    trained = LlamaForCausalLM.from_pretrained(str(out / "policy"))
    assert max(float(np.abs(x.numpy() - y.numpy()).max())
               for x, y in zip(trained.parameters(), start.parameters())) > 1e-4  # the run really trained


STAGES = {  # stage: (entry point, argument file, model class, keys compared)
    "sft": ("sft/run_sft.py", "sft_argument.json", LlamaForCausalLM, ("loss", "grad_norm")),
    "rm": ("rm/run_reward.py", "rm_argument.json", ScoreModel, ("loss", "accuracy", "grad_norm")),
    "dpo": ("dpo/run_dpo.py", "dpo_argument.json", LlamaForCausalLM,
            ("loss", "rewards/margin", "rewards/accuracy", "grad_norm")),
}
STAGE_LAYOUTS = [  # (stage, layout name, processes, flags, data degree)
    ("sft", "tp2xsharding2", 4, ["--tensor_parallel_degree", "2", "--sharding", "stage1"], 2),
    ("rm", "tp2xdp2", 4, ["--tensor_parallel_degree", "2"], 2),
    ("dpo", "sharding2xdp2", 4, ["--sharding", "stage1", "--sharding_parallel_degree", "2"], 4),
    ("sft", "tp2xpp2", 4, ["--tensor_parallel_degree", "2", "--pipeline_parallel_degree", "2"], 1),
    ("rm", "pp2xdp2", 4, ["--pipeline_parallel_degree", "2"], 2),
    ("dpo", "pp2xsharding2", 4, ["--pipeline_parallel_degree", "2", "--sharding", "stage1"], 2),
]


def stage_args(stage, start):
    """3 steps of 2 micro-batches of 4 (per process: 4 / data degree), evaluated at the end."""
    entry, config = STAGES[stage][:2]
    args = [os.path.join(REPO, "alignment", entry), os.path.join(REPO, "config", "tiny", config),
            "--model_name_or_path", start, "--max_steps", "3", "--eval_steps", "3",
            "--warmup_steps", "0", "--lr_scheduler_type", "constant", "--disable_tqdm", "--logging_steps", "1",
            "--adam_epsilon", "1.0", "--learning_rate", "0.01", "--gradient_accumulation_steps", "2",
            "--per_device_eval_batch_size", "3"]
    if stage != "sft":
        return args + ["--train_datasets", f"PKU-SafeRLHF/train:1.0:{REPO}/data/preference",
                       "--eval_datasets", f"PKU-SafeRLHF/test:0.4:{REPO}/data/preference"]
    return args + ["--train_datasets", f"alpaca:1.0:{REPO}/data/sft/train.jsonl",
                   "--eval_datasets", f"alpaca:0.4:{REPO}/data/sft/eval.jsonl"]


@pytest.mark.parametrize("stage, layout, processes, flags, data_degree", STAGE_LAYOUTS,
                         ids=[f"{case[0]}-{case[1]}" for case in STAGE_LAYOUTS])
def test_supervised_stages_under_combined_layouts_equal_one_process(tiny_model_dir, tiny_reward_dir, tmp_path,
                                                                    stage, layout, processes, flags, data_degree):
    """8 samples a step in micro-batches of 4 (2 accumulation steps): 4 per micro-batch in one process, 4/d per
    data rank under the layout (sft: answers of different lengths, so the per-rank token means are weighted into
    the micro-batch's token mean). Pipeline layouts run the 2 micro-batches 1F1B through 2 stages, with the loss
    on the last stage; the rest run them one after the other. The reward model starts from a score checkpoint:
    a head initialised from scratch draws from an RNG stream that model construction under tensor parallelism
    advances differently, so it is a different (equally random) head, like another seed. Evaluation runs too
    (through the pipeline for pipeline layouts): its metrics must match as well."""
    logs = stage_run_matches(tmp_path, (tiny_model_dir, tiny_reward_dir), stage, layout, processes, flags,
                             data_degree)
    assert f"world {processes} = " in logs


def stage_run_matches(tmp_path, models, stage, layout, processes, flags, data_degree) -> str:
    """`stage` (sft, rm, dpo: stage_args) in one process and under a layout: every logged metric (evaluations too)
    and final weight within the tolerances; returns the layout run's logs. models: (causal, score) dirs."""
    cls, keys = STAGES[stage][2:]
    common = stage_args(stage, models[stage == "rm"])
    subprocess.run([sys.executable, *common, "--per_device_train_batch_size", "4", "--output_dir",
                    str(tmp_path / "one")], cwd=REPO, check=True, capture_output=True)
    logs = launch(tmp_path / "logs", common + flags + ["--per_device_train_batch_size", str(4 // data_degree),
                                                       "--output_dir", str(tmp_path / layout)], processes)
    eval_keys = tuple(f"eval/{key}" for key in keys if key != "grad_norm")
    metrics, weights = worst_relative_difference(tmp_path / "one", tmp_path / layout, keys + eval_keys,
                                                 [("model", cls)])
    print(f"\n{stage} {layout}: worst relative difference: metrics {metrics:.1e}, weights {weights:.1e}")
    return logs


def run_layout(layout, args_for, out, log_dir, *extra):
    """One process (layout None) or a layout (a name in LAYOUTS, or (processes, flags, data degree)) on its
    processes; args_for(data_degree, out) builds the arguments."""
    if layout is None:
        subprocess.run([sys.executable, *args_for(1, out), *extra], cwd=REPO, check=True, capture_output=True)
        return
    processes, flags, data_degree = LAYOUTS[layout] if isinstance(layout, str) else layout
    launch(log_dir, args_for(data_degree, out) + flags + list(extra), processes)


def keep_steps(run, copy, first: int, models) -> None:
    """`copy`: the metrics rows of `run` from step `first` on, and its final models (the subdirectories named)."""
    copy.mkdir()
    with open(copy / "metrics.jsonl", "w") as f:
        f.writelines(json.dumps(row) + "\n" for row in read_metrics(run) if row["step"] >= first)
    for sub in models:
        shutil.copytree(run / sub, copy / sub)


def resume_across(tmp_path, tiny_model_dir, tiny_reward_dir, saved_under, resumed_under):
    """checkpoint-2 of a 4-step PPO run under `saved_under` resumed under `resumed_under` (run_layout's layouts):
    checks steps 3-4 and the final weights against the run that never stopped; returns the worst differences."""
    def args_for(data_degree, out):
        return rl_args("gae", tiny_model_dir, tiny_reward_dir, data_degree, out)[:-2] + [
            "--max_steps", "4", "--save_steps", "2", "--output_dir", str(out)]

    run_layout(saved_under, args_for, tmp_path / "straight", tmp_path / "logs-a")
    resumed = tmp_path / "resumed"
    resumed.mkdir()
    shutil.copytree(tmp_path / "straight" / "checkpoint-2", resumed / "checkpoint-2")
    run_layout(resumed_under, args_for, resumed, tmp_path / "logs-b", "--resume_from_checkpoint", "auto")
    assert [r["step"] for r in read_metrics(resumed)] == [3, 4]
    keep_steps(tmp_path / "straight", tmp_path / "straight-3-4", 3, ("policy", "value"))
    return worst_relative_difference(tmp_path / "straight-3-4", resumed, RL_KEYS + ("critic_loss",),
                                     [("policy", LlamaForCausalLM), ("value", ScoreModel)])


@pytest.mark.parametrize("saved_under, resumed_under", [("tp2xpp2xdp2", None), (None, "tp2xpp2xdp2"),
                                                        (None, "tp2xsharding2")],
                         ids=["tp2xpp2xdp2-to-one", "one-to-tp2xpp2xdp2", "one-to-tp2xsharding2"])
def test_a_checkpoint_resumes_under_another_layout(tiny_model_dir, tiny_reward_dir, tmp_path, saved_under,
                                                   resumed_under):
    """checkpoint-2 of a 4-step PPO run, resumed under another layout (optimizer states resharded: gathered whole
    at save, sliced / given to their sharding owner at load), gives steps 3-4 and final weights equal to the run
    that never stopped under the first layout."""
    metrics, weights = resume_across(tmp_path, tiny_model_dir, tiny_reward_dir, saved_under, resumed_under)
    print(f"\n{saved_under or 'one'} -> {resumed_under or 'one'}: worst relative difference: metrics "
          f"{metrics:.1e}, weights {weights:.1e}")


def processes_naming(text):
    """PIDs of the processes whose command line contains `text` as one argument."""
    pids = []
    for entry in os.listdir("/proc"):
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                if text.encode() in f.read().split(b"\0"):
                    pids.append(int(entry))
        except (OSError, ValueError):
            continue
    return pids


def test_a_kill_during_a_save_under_a_combined_layout_leaves_the_previous_checkpoint(tiny_model_dir, tmp_path):
    """SFT under tp2 x pp2 (4 processes) saving every 2 steps, every process SIGKILLed while checkpoint-4 is being
    written (its temporary directory exists): `latest` still names checkpoint-2, which every rank loads on
    `resume_from_checkpoint auto`, and the resumed run ends as the run that was never stopped."""
    args = stage_args("sft", tiny_model_dir) + ["--max_steps", "6", "--save_steps", "2", "--eval_steps", "0",
                                                "--per_device_train_batch_size", "4"]
    subprocess.run([sys.executable, *args, "--output_dir", str(tmp_path / "straight")], cwd=REPO, check=True,
                   capture_output=True)
    out = tmp_path / "killed"
    flags = ["--tensor_parallel_degree", "2", "--pipeline_parallel_degree", "2"]
    cmd = [sys.executable, "-m", "paddle.distributed.launch", "--nproc_per_node", "4", "--log_dir",
           str(tmp_path / "logs"), *args, *flags, "--output_dir", str(out)]
    launcher = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline, half_written, pids = time.time() + 600, [], []
    while not half_written and launcher.poll() is None and time.time() < deadline:
        if len(pids) < 5 and (out / "checkpoint-2").exists():  # the launcher and its 4 workers are all up
            pids = processes_naming(str(out))
        half_written = glob.glob(str(out / ".checkpoint-4.tmp-*"))
        time.sleep(0.002)
    for pid in pids:  # every process of the run, at once
        os.kill(pid, signal.SIGKILL)
    launcher.wait(timeout=60)
    assert half_written and os.path.isdir(half_written[0]), "the kill did not land during the save of checkpoint-4"
    assert (out / "latest").read_text().strip() == "checkpoint-2"
    assert not (out / "checkpoint-4").exists()

    launch(tmp_path / "logs-resumed", args + flags + ["--output_dir", str(out), "--resume_from_checkpoint", "auto"],
           4)
    assert [r["step"] for r in read_metrics(out) if "loss" in r] == [1, 2, 3, 4, 5, 6]  # no row lost or repeated
    keep_steps(out, tmp_path / "resumed-3-6", 3, ("model",))
    keep_steps(tmp_path / "straight", tmp_path / "straight-3-6", 3, ("model",))
    worst_relative_difference(tmp_path / "straight-3-6", tmp_path / "resumed-3-6", ("loss", "grad_norm"),
                              [("model", LlamaForCausalLM)])
