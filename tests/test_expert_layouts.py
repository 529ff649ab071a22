"""Expert parallelism on 2 and 4 CPU processes (gloo) against one process: Qwen3-MoE (top-k normalised, no shared
experts) and ERNIE 4.5 MoE (score correction, shared experts) with their 8 experts split over ep=2 ranks, alone
(2 processes) and with 2 data-parallel copies (ep2 x dp2, 4 processes: the experts' gradients are summed over the
ranks that hold them). One step of tests/scripts/ep_step.py on a fixed global batch: logits, replayed logits (MoE
routing replay), the loss with the load-balancing term, every gradient and the weights after one AdamW step equal
one process's within 1e-5 of each tensor's largest magnitude (as tests/test_layouts.py); the checkpoint saved under
ep=2 is whole (the HF layout: it loads in one process), read from the one-process checkpoint. SFT through its entry
point under ep2 and ep2 x dp2 (the load-balancing loss on, an evaluation at the end) logs and saves what one process
does; an RL run and experts that do not split are refused in one line. Marked `parallel`."""
import json
import os
import shutil
import subprocess
import sys

import numpy as np
import paddle
import pytest

from alignment.models import LlamaForCausalLM
from tests.helpers import REPO, read_metrics
from tests.scripts.ep_step import BATCH, batch, named_gradients, optimizer, step

pytestmark = pytest.mark.parallel

FIXTURES = os.path.join(os.path.dirname(__file__), "fixtures", "models")
LAYOUTS = {"ep2": 2, "ep2xdp2": 4}  # name: processes (expert_parallel_degree 2)


def launch(log_dir, args, nproc, expect_ok=True):
    cmd = [sys.executable, "-m", "paddle.distributed.launch", "--nproc_per_node", str(nproc), "--log_dir",
           str(log_dir), *args]
    done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=600)
    logs = "".join(open(os.path.join(log_dir, f)).read() for f in sorted(os.listdir(log_dir))
                   if f.startswith("workerlog"))
    assert (done.returncode == 0) == expect_ok, done.stdout[-2000:] + done.stderr[-2000:] + logs[-4000:]
    return logs


def one_process_step(model_dir):
    """The step of ep_step.py on the whole batch in one process: (logits, replayed, loss, gradients, model after
    one AdamW step)."""
    model = LlamaForCausalLM.from_pretrained(model_dir)
    logits, replayed, loss = step(model, paddle.to_tensor(batch(model.config.vocab_size)))
    grads = named_gradients(model)
    optimizer(model).step()
    return logits.numpy(), replayed.numpy(), float(loss), grads, model


def assert_close(actual, expected, what):
    scale = float(np.abs(expected).max())
    np.testing.assert_allclose(actual, expected, rtol=1e-5, atol=1e-5 * scale, err_msg=what)


@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("name", ["qwen3_moe", "ernie4_5_moe"])
def test_expert_parallel_step_equals_one_process(name, layout, tmp_path):
    processes, model_dir = LAYOUTS[layout], os.path.join(FIXTURES, name)
    logs = launch(tmp_path / "logs", [os.path.join(REPO, "tests", "scripts", "ep_step.py"), model_dir,
                                      str(tmp_path), "2"], processes)
    assert f"world {processes} = tensor 1 x pipeline 1 x sharding 1 x data {processes}, experts split over 2" in logs
    logits, replayed, loss, grads, stepped = one_process_step(model_dir)
    assert np.abs(replayed - logits).max() > 0.1  # the replayed choices changed the routing
    seen_rows, seen_grads = [], set()
    for r in range(processes):
        ranked = np.load(tmp_path / f"rank{r}.npz")
        rows = ranked["rows"].tolist()
        seen_rows += rows
        assert_close(ranked["logits"], logits[rows], f"rank {r} logits")
        assert_close(ranked["replayed"], replayed[rows], f"rank {r} replayed logits")
        held = {key[len("grad/"):] for key in ranked.files if key.startswith("grad/")}
        experts = {k for k in held if ".experts." in k}
        assert len(experts) == len({k for k in grads if ".experts." in k}) // 2  # half the experts
        for key in held:
            assert_close(ranked[f"grad/{key}"], grads[key], f"rank {r} gradient of {key}")
        seen_grads |= held
    assert sorted(seen_rows) == list(range(BATCH)) and seen_grads == set(grads)  # every expert has its gradient
    # each rank's loss is its tokens' mean + the global load-balancing term; averaged, one process's loss
    losses = [float(np.load(tmp_path / f"rank{r}.npz")["loss"]) for r in range(processes)]
    np.testing.assert_allclose(np.mean(losses), loss, rtol=1e-5)
    saved = LlamaForCausalLM.from_pretrained(str(tmp_path / "model"))  # whole: loads in one process
    moved = 0.0
    start = dict(LlamaForCausalLM.from_pretrained(model_dir).named_parameters())
    for (key, x), y in zip(stepped.named_parameters(), saved.parameters()):
        assert_close(y.numpy(), x.numpy(), f"weight {key} after one step")
        moved = max(moved, float(np.abs(x.numpy() - start[key].numpy()).max()))
    assert moved > 1e-3  # the step really moved the weights


@pytest.fixture(scope="module")
def moe_sft_model(tiny_model_dir, tmp_path_factory):
    """The tiny model's shape and tokenizer as Qwen3-MoE: 4 experts (top 2) in every layer, seeded random weights,
    the load-balancing loss in training (output_router_logits, coefficient 0.01)."""
    from alignment.models import LlamaConfig

    root = tmp_path_factory.mktemp("moe-sft")
    shutil.copytree(tiny_model_dir, root / "config")
    config = json.load(open(root / "config" / "config.json"))
    config.update(model_type="qwen3_moe", num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
                  norm_topk_prob=True, output_router_logits=True, router_aux_loss_coef=0.01)
    json.dump(config, open(root / "config" / "config.json", "w"))
    paddle.seed(3)
    LlamaForCausalLM(LlamaConfig.from_pretrained(str(root / "config"))).save_pretrained(
        str(root / "model"), tokenizer_dir=tiny_model_dir)
    return str(root / "model")


def sft_args(model):
    return [os.path.join(REPO, "alignment", "sft", "run_sft.py"), os.path.join(REPO, "config", "tiny",
                                                                               "sft_argument.json"),
            "--model_name_or_path", model, "--max_steps", "3", "--disable_tqdm", "--logging_steps", "1",
            "--adam_epsilon", "1.0", "--learning_rate", "0.02", "--warmup_steps", "0", "--lr_scheduler_type",
            "constant", "--eval_steps", "3", "--per_device_eval_batch_size", "3",
            "--train_datasets", f"alpaca:1.0:{REPO}/data/sft/train.jsonl",
            "--eval_datasets", f"alpaca:0.4:{REPO}/data/sft/eval.jsonl"]


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_sft_under_expert_parallelism_equals_one_process(moe_sft_model, tmp_path, layout):
    """4 samples a step (answers of different lengths on each rank), the load-balancing loss in the loss."""
    processes = LAYOUTS[layout]
    subprocess.run([sys.executable, *sft_args(moe_sft_model), "--per_device_train_batch_size", "4",
                    "--output_dir", str(tmp_path / "one")], cwd=REPO, check=True, capture_output=True)
    logs = launch(tmp_path / "logs", sft_args(moe_sft_model) + [
        "--per_device_train_batch_size", str(4 // processes), "--expert_parallel_degree", "2",
        "--output_dir", str(tmp_path / layout)], processes)
    assert "experts split over 2" in logs
    one, other = read_metrics(tmp_path / "one"), read_metrics(tmp_path / layout)
    for key in ("loss", "grad_norm", "moe/aux_loss", "eval/loss"):
        x, y = [r[key] for r in one if key in r], [r[key] for r in other if key in r]
        assert len(x) == len(y) > 0, key
        np.testing.assert_allclose(y, x, rtol=1e-5, err_msg=key)
    start = dict(LlamaForCausalLM.from_pretrained(moe_sft_model).named_parameters())
    trained = LlamaForCausalLM.from_pretrained(str(tmp_path / layout / "model"))
    moved = []
    for (key, x), y in zip(LlamaForCausalLM.from_pretrained(str(tmp_path / "one" / "model")).named_parameters(),
                           trained.parameters()):
        assert_close(y.numpy(), x.numpy(), f"weight {key}")
        if ".experts." in key:
            moved.append(np.abs(x.numpy() - start[key].numpy()).max() > 1e-5)
    assert len(moved) == 4 * 4 * 3 and np.mean(moved) > 0.5  # most experts trained (some got no token)


def test_an_rl_run_and_experts_that_do_not_split_are_refused_in_one_line(moe_sft_model, tiny_reward_dir, tmp_path):
    ppo = [os.path.join(REPO, "alignment", "ppo", "run_ppo.py"), os.path.join(REPO, "config", "tiny",
                                                                              "ppo_argument.json"),
           "--actor_model_name_or_path", moe_sft_model, "--reward_model_name_or_path", tiny_reward_dir,
           "--output_dir", str(tmp_path / "ppo"), "--expert_parallel_degree", "2"]
    logs = launch(tmp_path / "logs-ppo", ppo, 2, expect_ok=False)
    assert "error: key 'expert_parallel_degree': RL runs decode rollouts" in logs and "Traceback" not in logs
    logs = launch(tmp_path / "logs-sft", sft_args(moe_sft_model) + ["--expert_parallel_degree", "3", "--output_dir",
                                                                    str(tmp_path / "sft")], 3, expect_ok=False)
    assert "4 experts are not divisible by expert_parallel_degree 3 (key 'expert_parallel_degree')" in logs
    assert "Traceback" not in logs and not (tmp_path / "sft" / "model").exists()
