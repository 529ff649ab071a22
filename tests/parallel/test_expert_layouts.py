"""Expert parallelism on 2 and 4 CPU processes (gloo) against one process: Qwen3-MoE (top-k normalised, no shared
experts) and ERNIE 4.5 MoE (score correction, shared experts) with their 8 experts split over ep=2 ranks, alone
(2 processes) and with 2 data-parallel copies (ep2 x dp2, 4 processes: the experts' gradients are summed over the
ranks that hold them). One step of tests/scripts/ep_step.py on a fixed global batch: logits, replayed logits (MoE
routing replay), the loss with the load-balancing term, every gradient and the weights after one AdamW step equal
one process's within 1e-5 of each tensor's largest magnitude (as tests/parallel/test_layouts.py); the checkpoint
saved under ep=2 is whole (the HF layout: it loads in one process), read from the one-process checkpoint. SFT through its entry
point under ep2 and ep2 x dp2 (the load-balancing loss on, an evaluation at the end) and DPO under ep2 log and save
what one process does; a step checkpoint written under ep2 resumes in one process; RLOO and PPO under ep2 log and
save what one process does; rollout ranks with expert parallelism and experts that do not split are refused in one
line. Marked `parallel`."""
import json
import os
import shutil
import subprocess
import sys

import numpy as np
import paddle
import pytest
from safetensors.numpy import load_file

from alignment.models import LlamaForCausalLM
from alignment.models.score_model import ScoreModel
from tests.helpers import REPO, read_metrics
from tests.scripts.ep_step import BATCH, batch, named_gradients, optimizer, step
from tests.parallel.test_layouts import rl_args, rl_run_matches

pytestmark = pytest.mark.parallel

FIXTURES = os.path.join(os.path.dirname(os.path.dirname(__file__)), "fixtures", "models")
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
    written, read = load_file(str(tmp_path / "loaded" / "model.safetensors")), load_file(
        os.path.join(model_dir, "model.safetensors"))
    assert sorted(written) == sorted(read)  # the whole HF layout, every expert
    for key in read:
        np.testing.assert_array_equal(written[key], read[key], err_msg=key)  # gathered back bit for bit
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


STAGES = {  # stage: (entry point, argument file, data, keys compared)
    "sft": ("sft/run_sft.py", "sft_argument.json", ("alpaca:1.0:{}/data/sft/train.jsonl",
                                                    "alpaca:0.4:{}/data/sft/eval.jsonl"),
            ("loss", "grad_norm", "moe/aux_loss", "eval/loss")),
    "dpo": ("dpo/run_dpo.py", "dpo_argument.json", ("PKU-SafeRLHF/train:1.0:{}/data/preference",
                                                    "PKU-SafeRLHF/test:0.4:{}/data/preference"),
            ("loss", "grad_norm", "rewards/margin", "eval/loss")),
    "rm": ("rm/run_reward.py", "rm_argument.json", ("PKU-SafeRLHF/train:1.0:{}/data/preference",
                                                   "PKU-SafeRLHF/test:0.4:{}/data/preference"),
           ("loss", "accuracy", "grad_norm", "eval/loss")),
}


def stage_args(stage, model):
    entry, config, (train, evaluate), _ = STAGES[stage]
    return [os.path.join(REPO, "alignment", entry), os.path.join(REPO, "config", "tiny", config),
            "--model_name_or_path", model, "--max_steps", "3", "--disable_tqdm", "--logging_steps", "1",
            "--adam_epsilon", "1.0", "--learning_rate", "0.02", "--warmup_steps", "0", "--lr_scheduler_type",
            "constant", "--eval_steps", "3", "--per_device_eval_batch_size", "3",
            "--train_datasets", train.format(REPO), "--eval_datasets", evaluate.format(REPO)]


def sft_args(model):
    return stage_args("sft", model)


def assert_same_run(one, other, keys, start, cls=LlamaForCausalLM):
    """Every logged key of every step within rtol 1e-5 and every final weight within the tolerance."""
    a, b = read_metrics(one), read_metrics(other)
    for key in keys:
        x, y = [r[key] for r in a if key in r], [r[key] for r in b if key in r]
        assert len(x) == len(y) > 0, key
        np.testing.assert_allclose(y, x, rtol=1e-5, atol=1e-7, err_msg=key)
    first = dict(cls.from_pretrained(start).named_parameters())
    moved = 0.0
    for (key, x), y in zip(cls.from_pretrained(str(one / "model")).named_parameters(),
                           cls.from_pretrained(str(other / "model")).parameters()):
        assert_close(y.numpy(), x.numpy(), f"weight {key}")
        moved = max(moved, float(np.abs(x.numpy() - first[key].numpy()).max()))
    assert moved > 1e-3  # the runs really trained


@pytest.fixture(scope="module")
def moe_score_model(moe_sft_model, tmp_path_factory):
    """A score model on the MoE backbone with a seeded random head (made once, so both runs start from it)."""
    paddle.seed(11)
    path = str(tmp_path_factory.mktemp("moe-rm") / "model")
    ScoreModel.from_pretrained(moe_sft_model).save_pretrained(path, tokenizer_dir=moe_sft_model)
    return path


ENTRY_LAYOUTS = {  # name: (processes, data ranks, flags besides expert_parallel_degree 2)
    "ep2": (2, 2, []), "ep2xdp2": (4, 4, []),
    "ep2xsharding2": (4, 4, ["--sharding", "stage1", "--sharding_parallel_degree", "2"]),
    "ep2xpp2": (4, 2, ["--pipeline_parallel_degree", "2"]), "ep2xtp2": (4, 2, ["--tensor_parallel_degree", "2"])}


@pytest.mark.parametrize("stage, layout", [("sft", "ep2"), ("sft", "ep2xdp2"), ("sft", "ep2xsharding2"),
                                           ("sft", "ep2xpp2"), ("sft", "ep2xtp2"), ("dpo", "ep2"), ("rm", "ep2")])
def test_the_supervised_stages_under_expert_parallelism_equal_one_process(moe_sft_model, moe_rl_model, moe_score_model,
                                                                          tmp_path, stage, layout):
    """4 samples a step (answers of different lengths on each rank; SFT with the load-balancing loss in its loss,
    DPO with an expert-parallel reference model too, the reward model on the MoE backbone), an evaluation at the
    end. Under sharding stage1 each expert-parallel group takes one rank of each sharding group, whose ranks hold
    the same experts and split their AdamW states; under pipeline parallelism (which refuses the load-balancing
    loss) each stage's experts are split over the data ranks of that stage."""
    processes, ranks, flags = ENTRY_LAYOUTS[layout]
    start = moe_score_model if stage == "rm" else moe_rl_model if "pp2" in layout else moe_sft_model
    keys = tuple(key for key in STAGES[stage][3] if not ("pp2" in layout and key.startswith("moe/")))
    subprocess.run([sys.executable, *stage_args(stage, start), "--per_device_train_batch_size", "4",
                    "--output_dir", str(tmp_path / "one")], cwd=REPO, check=True, capture_output=True)
    logs = launch(tmp_path / "logs", stage_args(stage, start) + [
        "--per_device_train_batch_size", str(4 // ranks), "--expert_parallel_degree", "2", *flags,
        "--output_dir", str(tmp_path / layout)], processes)
    assert "experts split over 2" in logs
    layers = 2 if "pp2" in layout else 4  # a pipeline stage holds half the layers
    assert all(f"experts {held} of 4 in each of its {layers} sparse layers" in logs for held in ("0-1", "2-3"))
    assert_same_run(tmp_path / "one", tmp_path / layout, keys, start,
                    ScoreModel if stage == "rm" else LlamaForCausalLM)


@pytest.mark.parametrize("layout", ["ep2", "ep2xsharding2", "ep2xpp2", "ep2xtp2"])
def test_a_step_checkpoint_written_under_expert_parallelism_resumes_in_one_process(moe_sft_model, moe_rl_model,
                                                                                   tmp_path, layout):
    """checkpoint-2 of an SFT run under ep2, ep2 x sharding stage1 or ep2 x pp2 (every expert's weights and AdamW
    states gathered) resumed by one process ends like the one-process run that never stopped."""
    processes, ranks, flags = ENTRY_LAYOUTS[layout]
    if "pp2" in layout:  # pipelines refuse the load-balancing loss
        moe_sft_model = moe_rl_model
    subprocess.run([sys.executable, *sft_args(moe_sft_model), "--per_device_train_batch_size", "4",
                    "--output_dir", str(tmp_path / "one")], cwd=REPO, check=True, capture_output=True)
    launch(tmp_path / "logs", sft_args(moe_sft_model) + [
        "--per_device_train_batch_size", str(4 // ranks), "--save_steps", "2", "--expert_parallel_degree", "2",
        *flags, "--output_dir", str(tmp_path / layout)], processes)
    (tmp_path / "resumed").mkdir()
    shutil.copytree(tmp_path / layout / "checkpoint-2", tmp_path / "resumed" / "checkpoint-2")
    done = subprocess.run([sys.executable, *sft_args(moe_sft_model), "--per_device_train_batch_size", "4",
                           "--output_dir", str(tmp_path / "resumed"), "--resume_from_checkpoint", "auto"],
                          cwd=REPO, capture_output=True, text=True)
    assert done.returncode == 0 and "resumed from" in done.stdout + done.stderr, done.stderr[-2000:]
    assert [r["step"] for r in read_metrics(tmp_path / "resumed") if "loss" in r] == [3]
    one = [r for r in read_metrics(tmp_path / "one") if r["step"] == 3 and "loss" in r]
    resumed = [r for r in read_metrics(tmp_path / "resumed") if "loss" in r]
    for key in ("loss", "grad_norm") + (("moe/aux_loss",) if "pp2" not in layout else ()):
        np.testing.assert_allclose(resumed[0][key], one[0][key], rtol=1e-5, err_msg=key)
    for (key, x), y in zip(LlamaForCausalLM.from_pretrained(str(tmp_path / "one" / "model")).named_parameters(),
                           LlamaForCausalLM.from_pretrained(str(tmp_path / "resumed" / "model")).parameters()):
        assert_close(y.numpy(), x.numpy(), f"weight {key}")


@pytest.fixture(scope="module")
def moe_rl_model(moe_sft_model, tmp_path_factory):
    """moe_sft_model without the load-balancing loss: an update's micro-batches are drawn from each rank's rows,
    so the ranks' micro-batches together are other rows than one process's, and the loss, a product of counts and
    probabilities over a micro-batch's tokens, differs with the grouping under any data-parallel layout."""
    path = tmp_path_factory.mktemp("moe-rl") / "model"
    shutil.copytree(moe_sft_model, path)
    config = json.load(open(path / "config.json"))
    config.update(output_router_logits=False)
    json.dump(config, open(path / "config.json", "w"))
    return str(path)


@pytest.mark.parametrize("estimator, layout", [("rloo", "ep2"), ("gae", "ep2"), ("rloo", "ep2xsharding2"),
                                               ("rloo", "ep2xpp2"), ("rloo", "ep2xtp2")])
def test_an_rl_run_under_expert_parallelism_equals_one_process(moe_rl_model, tiny_reward_dir, tmp_path, estimator,
                                                               layout):
    """RLOO and PPO with a critic (3 steps, 8 rollouts a step) under ep2 (and RLOO under ep2 x sharding stage1):
    the actor, the reference and the critic expert-parallel, rollouts decoded by a whole copy refreshed each step."""
    one = tmp_path / "one"
    done = subprocess.run([sys.executable, *rl_args(estimator, moe_rl_model, tiny_reward_dir, 1, one)], cwd=REPO,
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    processes, ranks, flags = ENTRY_LAYOUTS[layout]
    _, logs = rl_run_matches(one, tmp_path, (moe_rl_model, tiny_reward_dir), estimator, layout, processes,
                             ["--expert_parallel_degree", "2", *flags], ranks)
    assert "experts split over 2" in logs


def test_rollout_ranks_and_experts_that_do_not_split_are_refused_in_one_line(moe_sft_model, tiny_reward_dir,
                                                                             tmp_path):
    ppo = [os.path.join(REPO, "alignment", "ppo", "run_ppo.py"), os.path.join(REPO, "config", "tiny",
                                                                              "ppo_argument.json"),
           "--actor_model_name_or_path", moe_sft_model, "--reward_model_name_or_path", tiny_reward_dir,
           "--output_dir", str(tmp_path / "ppo"), "--expert_parallel_degree", "2", "--rollout_ranks", "1"]
    logs = launch(tmp_path / "logs-ppo", ppo, 3, expect_ok=False)
    assert "error: key 'expert_parallel_degree' with rollout_ranks > 0" in logs and "Traceback" not in logs
    logs = launch(tmp_path / "logs-sft", sft_args(moe_sft_model) + ["--expert_parallel_degree", "3", "--output_dir",
                                                                    str(tmp_path / "sft")], 3, expect_ok=False)
    assert "4 experts are not divisible by expert_parallel_degree 3 (key 'expert_parallel_degree')" in logs
    assert "Traceback" not in logs and not (tmp_path / "sft" / "model").exists()
