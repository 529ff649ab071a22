"""Hybrid parallelism on 2 CPU processes (gloo) against one process: tensor parallel (tp2), pipeline parallel (pp2),
sharding stage 1 over 2 data ranks, eval_mode single, a tp2 checkpoint read back by one process, and exact resume
under each layout. Marked `parallel` (run with
`pytest -m parallel`; .ci/run runs them after the default suite).

Runs use adam_epsilon 1 so AdamW updates are linear in the gradient: with the default 1e-8 an element whose
gradient is ~0 moves by +-lr depending on the sign of float noise, which no two summation orders agree on.
"""
import os
import subprocess
import sys

import numpy as np
import pytest

from alignment.models import LlamaForCausalLM
from alignment.models.score_model import ScoreModel
from tests.helpers import REPO, read_metrics

pytestmark = pytest.mark.parallel

PPO = [os.path.join(REPO, "alignment", "ppo", "run_ppo.py"), os.path.join(REPO, "config", "tiny", "ppo_argument.json")]
LOSSES = ("actor_loss", "critic_loss", "reward/mean", "reward/std", "kl", "clip_frac", "approx_kl", "entropy")


def launch(log_dir, args, nproc=2, expect_ok=True):
    cmd = [sys.executable, "-m", "paddle.distributed.launch", "--nproc_per_node", str(nproc), "--log_dir",
           str(log_dir), *args]
    done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300)
    logs = "".join(open(os.path.join(log_dir, f)).read() for f in sorted(os.listdir(log_dir))
                   if f.startswith("workerlog"))
    if expect_ok:
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:] + logs[-3000:]
    return done.returncode, logs


def ppo_args(tiny_model_dir, tiny_reward_dir, out):
    return [*PPO, "--actor_model_name_or_path", tiny_model_dir, "--reward_model_name_or_path", tiny_reward_dir,
            "--eval_datasets", "", "--max_steps", "4", "--max_new_tokens", "12", "--disable_tqdm",
            "--adam_epsilon", "1.0", "--learning_rate", "0.02", "--critic_learning_rate", "0.02",
            "--per_device_prompt_batch_size", "8", "--per_device_train_batch_size", "8",  # later flags win
            "--output_dir", str(out)]


MICRO_BATCHES = ["--per_device_train_batch_size", "4", "--gradient_accumulation_steps", "2"]


@pytest.fixture(scope="module")
def one_process(tiny_model_dir, tiny_reward_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("one") / "run"
    subprocess.run([sys.executable, *ppo_args(tiny_model_dir, tiny_reward_dir, out)], cwd=REPO, check=True,
                   capture_output=True)
    return out


@pytest.fixture(scope="module")
def one_process_micro_batches(tiny_model_dir, tiny_reward_dir, tmp_path_factory):
    """The one-process run with each update batch in 2 micro-batches of 4 (what the pipeline runs 1F1B)."""
    out = tmp_path_factory.mktemp("one-micro") / "run"
    subprocess.run([sys.executable, *ppo_args(tiny_model_dir, tiny_reward_dir, out), *MICRO_BATCHES], cwd=REPO,
                   check=True, capture_output=True)
    return out


def assert_same_run(one, other, tiny_model_dir):
    a, b = read_metrics(one), read_metrics(other)
    assert [r["step"] for r in a] == [r["step"] for r in b] == [1, 2, 3, 4]
    for key in LOSSES:
        np.testing.assert_allclose([r[key] for r in b], [r[key] for r in a], rtol=1e-5, atol=1e-6, err_msg=key)
    start = LlamaForCausalLM.from_pretrained(tiny_model_dir)
    moved = 0.0
    for sub, cls in (("policy", LlamaForCausalLM), ("value", ScoreModel)):
        x_model, y_model = cls.from_pretrained(str(one / sub)), cls.from_pretrained(str(other / sub))
        for (name, x), y in zip(x_model.named_parameters(), y_model.parameters()):
            np.testing.assert_allclose(y.numpy(), x.numpy(), rtol=1e-5, atol=1e-5 * float(np.abs(x.numpy()).max()),
                                       err_msg=f"{sub} {name}")
    for x, y in zip(LlamaForCausalLM.from_pretrained(str(one / "policy")).parameters(), start.parameters()):
        moved = max(moved, float(np.abs(x.numpy() - y.numpy()).max()))
    assert moved > 1e-3  # the runs really trained


def test_tensor_parallel_ppo_equals_one_process(one_process, tiny_model_dir, tiny_reward_dir, tmp_path):
    out = tmp_path / "tp2"
    _, logs = launch(tmp_path / "logs", ppo_args(tiny_model_dir, tiny_reward_dir, out) +
                     ["--tensor_parallel_degree", "2"])
    assert "world 2 = tensor 2 x pipeline 1 x sharding 1 x data 1" in logs
    assert_same_run(one_process, out, tiny_model_dir)


def test_tensor_parallel_with_a_whole_generation_copy_equals_one_process(one_process, tiny_model_dir,
                                                                         tiny_reward_dir, tmp_path):
    out = tmp_path / "tp2-single"
    launch(tmp_path / "logs", ppo_args(tiny_model_dir, tiny_reward_dir, out) +
           ["--tensor_parallel_degree", "2", "--eval_mode", "single"])
    assert_same_run(one_process, out, tiny_model_dir)


def test_pipeline_parallel_ppo_equals_one_process(one_process_micro_batches, tiny_model_dir, tiny_reward_dir,
                                                  tmp_path):
    """Policy and critic in 2 stages (embedding + 2 layers | 2 layers + head), 2 micro-batches per update in
    1F1B, the PPO and value losses on the last stage; rollouts and scoring from whole copies."""
    out = tmp_path / "pp2"
    _, logs = launch(tmp_path / "logs", ppo_args(tiny_model_dir, tiny_reward_dir, out) + MICRO_BATCHES +
                     ["--pipeline_parallel_degree", "2"])
    assert "world 2 = tensor 1 x pipeline 2 x sharding 1 x data 1" in logs
    assert_same_run(one_process_micro_batches, out, tiny_model_dir)


def test_pipeline_parallel_ppo_with_tied_embeddings_equals_one_process(tiny_model_dir, tiny_reward_dir, tmp_path):
    """A tied-embedding actor (SmolLM2-style): the first stage's embedding table is also the last stage's LM head,
    shared through fleet's SharedLayerDesc; the run and the table it trains equal one process."""
    import paddle

    from alignment.models import LlamaConfig

    config = LlamaConfig.from_pretrained(tiny_model_dir)
    config.tie_word_embeddings = True
    paddle.seed(3)
    tied = str(tmp_path / "tied")
    LlamaForCausalLM(config).save_pretrained(tied, tokenizer_dir=tiny_model_dir)
    one = tmp_path / "one"
    subprocess.run([sys.executable, *ppo_args(tied, tiny_reward_dir, one), *MICRO_BATCHES], cwd=REPO, check=True,
                   capture_output=True)
    out = tmp_path / "pp2"
    launch(tmp_path / "logs", ppo_args(tied, tiny_reward_dir, out) + MICRO_BATCHES + ["--pipeline_parallel_degree", "2"])
    assert_same_run(one, out, tied)
    assert LlamaForCausalLM.from_pretrained(str(out / "policy")).config.tie_word_embeddings


def test_sharding_stage1_over_two_data_ranks_equals_one_process(one_process, tiny_model_dir, tiny_reward_dir,
                                                                tmp_path):
    """Each rank samples, scores and trains 4 of the 8 prompts; whitening, token means and sampling noise are
    those of the whole batch, so the run equals the one-process run with 8 prompts."""
    out = tmp_path / "sharding"
    _, logs = launch(tmp_path / "logs", ppo_args(tiny_model_dir, tiny_reward_dir, out) +
                     ["--sharding", "stage1", "--per_device_prompt_batch_size", "4",
                      "--per_device_train_batch_size", "4"])
    assert "world 2 = tensor 1 x pipeline 1 x sharding 2 (stage1) x data 1" in logs
    assert "DygraphShardingOptimizer" in logs
    assert_same_run(one_process, out, tiny_model_dir)


def test_a_tensor_parallel_checkpoint_loads_in_one_process_with_the_same_logits(tiny_model_dir, tmp_path):
    out = tmp_path / "tp"
    launch(tmp_path / "logs", [os.path.join(REPO, "tests", "scripts", "tp_logits.py"), tiny_model_dir, str(out)])
    whole = LlamaForCausalLM.from_pretrained(str(out / "model"))
    start = LlamaForCausalLM.from_pretrained(tiny_model_dir)
    for (name, x), y in zip(whole.named_parameters(), start.parameters()):
        np.testing.assert_array_equal(x.numpy(), y.numpy(), err_msg=name)  # gathered back whole, bit for bit
    q = start.model.layers[0].self_attn.q_proj.weight.numpy()
    np.testing.assert_array_equal(np.load(out / "q_proj_slice.npy"), q[:, : q.shape[1] // 2])  # rank 0 held half
    import paddle

    ids = paddle.to_tensor([[5, 17, 300, 9, 44, 2], [3, 3, 12, 700, 81, 6]])
    mask = paddle.to_tensor([[1, 1, 1, 1, 1, 1], [0, 0, 1, 1, 1, 1]])
    np.testing.assert_allclose(np.load(out / "logits.npy"), whole(ids, attention_mask=mask).logits.numpy(),
                               rtol=1e-5, atol=1e-5)


def test_tensor_parallel_sft_equals_one_process(tiny_model_dir, tmp_path):
    sft = [os.path.join(REPO, "alignment", "sft", "run_sft.py"), os.path.join(REPO, "config", "tiny",
                                                                               "sft_argument.json"),
           "--model_name_or_path", tiny_model_dir, "--eval_datasets", "", "--max_steps", "3", "--disable_tqdm",
           "--logging_steps", "1", "--adam_epsilon", "1.0", "--learning_rate", "0.02"]
    subprocess.run([sys.executable, *sft, "--output_dir", str(tmp_path / "one")], cwd=REPO, check=True,
                   capture_output=True)
    launch(tmp_path / "logs", sft + ["--output_dir", str(tmp_path / "tp2"), "--tensor_parallel_degree", "2"])
    one, two = read_metrics(tmp_path / "one"), read_metrics(tmp_path / "tp2")
    np.testing.assert_allclose([r["loss"] for r in two], [r["loss"] for r in one], rtol=1e-5)
    np.testing.assert_allclose([r["grad_norm"] for r in two], [r["grad_norm"] for r in one], rtol=1e-5)
    a = LlamaForCausalLM.from_pretrained(str(tmp_path / "one" / "model"))
    b = LlamaForCausalLM.from_pretrained(str(tmp_path / "tp2" / "model"))
    for (name, x), y in zip(a.named_parameters(), b.parameters()):
        np.testing.assert_allclose(y.numpy(), x.numpy(), atol=1e-6, err_msg=name)


def test_a_model_whose_heads_do_not_split_fails_before_loading(tiny_model_dir, tmp_path):
    import json
    import shutil

    bad = tmp_path / "model"
    shutil.copytree(tiny_model_dir, bad)
    config = json.load(open(bad / "config.json"))
    config["num_key_value_heads"] = 1
    (bad / "config.json").write_text(json.dumps(config))
    sft = [os.path.join(REPO, "alignment", "sft", "run_sft.py"), os.path.join(REPO, "config", "tiny",
                                                                               "sft_argument.json"),
           "--model_name_or_path", str(bad), "--output_dir", str(tmp_path / "out"), "--tensor_parallel_degree", "2"]
    code, logs = launch(tmp_path / "logs", sft, expect_ok=False)
    assert code != 0
    assert "config.json: num_key_value_heads 1 is not divisible by tensor_parallel_degree 2" in logs
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("layout", [["--tensor_parallel_degree", "2"],
                                    ["--sharding", "stage1", "--per_device_prompt_batch_size", "4",
                                     "--per_device_train_batch_size", "4"],
                                    ["--pipeline_parallel_degree", "2", *MICRO_BATCHES]],
                         ids=["tp2", "sharding-stage1", "pp2"])
def test_step_checkpoints_resume_exactly_under_the_same_layout(tiny_model_dir, tiny_reward_dir, tmp_path, layout):
    """A run resumed from its checkpoint-2 (whole weights, whole optimizer states) ends like the run that never
    stopped (tests/parallel/test_layouts.py resumes checkpoints under other layouts)."""
    import shutil

    common = ppo_args(tiny_model_dir, tiny_reward_dir, tmp_path / "unused")[:-2] + ["--save_steps", "2", *layout]
    launch(tmp_path / "logs-a", common + ["--output_dir", str(tmp_path / "a")])
    checkpoint = tmp_path / "a" / "checkpoint-2"
    assert (checkpoint / "policy.optimizer.safetensors").exists()
    assert (checkpoint / "policy" / "model.safetensors").exists()
    (tmp_path / "b").mkdir()
    shutil.copytree(checkpoint, tmp_path / "b" / "checkpoint-2")
    _, logs = launch(tmp_path / "logs-b", common + ["--output_dir", str(tmp_path / "b"), "--resume_from_checkpoint",
                                                    "auto"])
    assert "resumed from" in logs and "at step 2" in logs
    a, b = read_metrics(tmp_path / "a"), read_metrics(tmp_path / "b")
    assert [r["step"] for r in b] == [3, 4]
    for key in LOSSES:
        assert [r[key] for r in a[2:]] == [r[key] for r in b], key
    for sub, cls in (("policy", LlamaForCausalLM), ("value", ScoreModel)):
        x_model = cls.from_pretrained(str(tmp_path / "a" / sub))
        y_model = cls.from_pretrained(str(tmp_path / "b" / sub))
        for (name, x), y in zip(x_model.named_parameters(), y_model.parameters()):
            np.testing.assert_array_equal(x.numpy(), y.numpy(), err_msg=f"{sub} {name}")
