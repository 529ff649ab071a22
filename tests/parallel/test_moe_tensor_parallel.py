"""Mixture-of-experts models under tensor parallelism (alignment/models/moe.py, moe_experts.py): every expert and
the shared experts split over 2 CPU processes (gloo) as the dense MLP is, the router whole, one sum over the group
per expert block, against one process.

- One step of tests/scripts/tp_moe_step.py (tests/scripts/ep_step.py's step: logits, logits under replayed routing,
  the loss with the load-balancing term at weight 0.5) on tiny Qwen3-MoE (top-k normalised) and ERNIE 4.5 MoE
  (score correction, shared experts; and with `use_bias`, the shared experts' down bias added once after the sum)
  checkpoints with 8 experts: the routing is the same on both ranks and is one
  process's; logits, replayed logits, loss, gradient norm, every gradient (the router's included) and the weights
  after one AdamW step equal one process's within 1e-5 of each tensor's largest magnitude
  (tests/parallel/test_layouts.py's tolerance); the checkpoint saved as read is the input bit for bit, and it loads whole in one process with the
  logits the split model computed.
- SFT through its entry point (3 steps, the load-balancing loss in the loss, an evaluation at the end) and RLOO
  (tests/parallel/test_layouts.py's critic-free recipe, 3 steps; the split actor decodes, and with
  moe_routing_replay: rollout replays its recorded routing) under tensor_parallel_degree 2 log the same values and save the same weights as one
  process, for both families; so does RLOO under tensor x pipeline parallelism (4 processes, untied heads).
- checkpoint-2 of a tp2 SFT run resumes in one process to the end of the run that never stopped.
- A moe_intermediate_size the degree does not divide: one line naming the key, before anything is built (default
  suite), and through the entry point.
Marked `parallel` except the first refusal."""
import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest
from safetensors.numpy import load_file

from alignment.models import LlamaForCausalLM
from tests.helpers import REPO, read_metrics
from tests.parallel.test_expert_layouts import (STAGES, assert_close, assert_same_run, launch, one_process_step,
                                                stage_args)
from tests.training.test_family_stages import family_checkpoint
from tests.parallel.test_layouts import LAYOUTS, rl_args, rl_run_matches

FIXTURES = os.path.join(os.path.dirname(os.path.dirname(__file__)), "fixtures", "models")
FAMILIES = ["qwen3_moe", "ernie4_5_moe"]
TP2 = ["--tensor_parallel_degree", "2"]


def test_an_expert_size_the_degree_does_not_divide_is_refused_before_anything_is_built(tmp_path):
    config = json.load(open(os.path.join(FIXTURES, "ernie4_5_moe", "config.json")))
    config["moe_intermediate_size"] = 15  # heads, intermediate_size and vocabulary all split over 2
    json.dump(config, open(tmp_path / "config.json", "w"))  # no weights: the check comes first
    with pytest.raises(ValueError, match=r"^\S+config.json: moe_intermediate_size 15 is not divisible by "
                                         r"tensor_parallel_degree 2 \(key 'tensor_parallel_degree'\)$"):
        LlamaForCausalLM.from_pretrained(str(tmp_path), tensor_parallel_degree=2)


def biased_ernie(path) -> str:
    """The ERNIE 4.5 MoE fixture with `use_bias` (every projection's bias, the shared experts' too; the routed
    experts have none), the biases drawn at random (seeded) rather than zero, so a bias counted once per rank shows."""
    import paddle

    from alignment.models import LlamaConfig

    config = json.load(open(os.path.join(FIXTURES, "ernie4_5_moe", "config.json")))
    config["use_bias"] = True
    paddle.seed(3)
    model = LlamaForCausalLM(LlamaConfig.from_dict(config))
    for name, param in model.named_parameters():
        if name.endswith(".bias"):
            param.set_value(paddle.randn(param.shape) * 0.1)
    model.save_pretrained(str(path))
    return str(path)


@pytest.mark.parallel
@pytest.mark.parametrize("name", FAMILIES + ["ernie4_5_moe with biases"])
def test_a_tensor_parallel_step_equals_one_process(name, tmp_path):
    model_dir = biased_ernie(tmp_path / "biased") if name.endswith("biases") else os.path.join(FIXTURES, name)
    logs = launch(tmp_path / "logs", [os.path.join(REPO, "tests", "scripts", "tp_moe_step.py"), model_dir,
                                      str(tmp_path)], 2)
    assert "world 2 = tensor 2 x pipeline 1 x sharding 1 x data 1" in logs
    written, read = load_file(str(tmp_path / "loaded" / "model.safetensors")), load_file(
        os.path.join(model_dir, "model.safetensors"))
    assert sorted(written) == sorted(read)  # the whole HF layout
    for key in read:
        np.testing.assert_array_equal(written[key], read[key], err_msg=key)  # slices gathered back bit for bit
    logits, replayed, loss, grads, stepped = one_process_step(model_dir)
    assert np.abs(replayed - logits).max() > 1e-3  # the replayed choices changed the routing (1e-5: the tolerance)
    ranks = [np.load(tmp_path / f"rank{r}.npz") for r in range(2)]
    np.testing.assert_array_equal(ranks[0]["routing"], ranks[1]["routing"])  # the same experts on both ranks
    whole = LlamaForCausalLM.from_pretrained(str(tmp_path / "loaded"))  # the saved split model, in one process
    import paddle

    from tests.scripts.ep_step import batch

    whole.train()
    reloaded = whole(paddle.to_tensor(batch(whole.config.vocab_size))).logits.numpy()
    norm = np.sqrt(sum(float(np.square(g.astype("float64")).sum()) for g in grads.values()))
    for r, ranked in enumerate(ranks):
        assert_close(ranked["logits"], logits, f"rank {r} logits")
        assert_close(ranked["logits"], reloaded, f"rank {r} logits against its checkpoint loaded whole")
        assert_close(ranked["replayed"], replayed, f"rank {r} replayed logits")
        np.testing.assert_allclose(float(ranked["loss"]), loss, rtol=1e-5, err_msg=f"rank {r} loss")
        np.testing.assert_allclose(float(ranked["grad_norm"]), norm, rtol=1e-5, err_msg=f"rank {r} gradient norm")
        assert {k[len("grad/"):] for k in ranked.files if k.startswith("grad/")} == set(grads)
        for key, grad in grads.items():
            assert_close(ranked[f"grad/{key}"], grad, f"rank {r} gradient of {key}")
    assert all(np.abs(grads[k]).max() > 0 for k in grads if k.endswith("mlp.gate.weight"))  # the routers learn
    saved = LlamaForCausalLM.from_pretrained(str(tmp_path / "model"))
    for (key, x), y in zip(stepped.named_parameters(), saved.parameters()):
        assert_close(y.numpy(), x.numpy(), f"weight {key} after one step")


@pytest.fixture(scope="module")
def moe_dirs(tiny_model_dir, tmp_path_factory):
    """Each family's tiny checkpoint with the tiny tokenizer, the load-balancing loss on in training."""
    root = tmp_path_factory.mktemp("moe-tp")
    return {family: family_checkpoint(family, tiny_model_dir, str(root / family), output_router_logits=True,
                                      router_aux_loss_coef=0.01) for family in FAMILIES}


@pytest.mark.parallel
@pytest.mark.parametrize("name", FAMILIES)
def test_sft_under_tensor_parallelism_equals_one_process(name, moe_dirs, tmp_path):
    start = moe_dirs[name]
    subprocess.run([sys.executable, *stage_args("sft", start), "--per_device_train_batch_size", "4",
                    "--output_dir", str(tmp_path / "one")], cwd=REPO, check=True, capture_output=True)
    logs = launch(tmp_path / "logs", stage_args("sft", start) + TP2 + [
        "--per_device_train_batch_size", "4", "--output_dir", str(tmp_path / "tp2")], 2)
    assert "world 2 = tensor 2 x" in logs
    assert_same_run(tmp_path / "one", tmp_path / "tp2", STAGES["sft"][3], start)


@pytest.mark.parallel
def test_a_step_checkpoint_written_under_tensor_parallelism_resumes_in_one_process(moe_dirs, tmp_path):
    """checkpoint-2 of a tp2 SFT run of ERNIE 4.5 MoE (the experts' and shared experts' slices and their AdamW states
    gathered whole) resumed by one process ends like the one-process run that never stopped."""
    start = moe_dirs["ernie4_5_moe"]
    args = stage_args("sft", start) + ["--per_device_train_batch_size", "4"]
    subprocess.run([sys.executable, *args, "--output_dir", str(tmp_path / "one")], cwd=REPO, check=True,
                   capture_output=True)
    launch(tmp_path / "logs", args + TP2 + ["--save_steps", "2", "--output_dir", str(tmp_path / "tp2")], 2)
    (tmp_path / "resumed").mkdir()
    shutil.copytree(tmp_path / "tp2" / "checkpoint-2", tmp_path / "resumed" / "checkpoint-2")
    done = subprocess.run([sys.executable, *args, "--output_dir", str(tmp_path / "resumed"),
                           "--resume_from_checkpoint", "auto"], cwd=REPO, capture_output=True, text=True)
    assert done.returncode == 0 and "resumed from" in done.stdout + done.stderr, done.stderr[-2000:]
    one = [r for r in read_metrics(tmp_path / "one") if r["step"] == 3 and "loss" in r]
    resumed = [r for r in read_metrics(tmp_path / "resumed") if "loss" in r]
    assert [r["step"] for r in resumed] == [3]
    for key in ("loss", "grad_norm", "moe/aux_loss"):
        np.testing.assert_allclose(resumed[0][key], one[0][key], rtol=1e-5, err_msg=key)
    for (key, x), y in zip(LlamaForCausalLM.from_pretrained(str(tmp_path / "one" / "model")).named_parameters(),
                           LlamaForCausalLM.from_pretrained(str(tmp_path / "resumed" / "model")).parameters()):
        assert_close(y.numpy(), x.numpy(), f"weight {key}")


@pytest.mark.parallel
@pytest.mark.parametrize("name, replay", [("qwen3_moe", "none"), ("ernie4_5_moe", "none"), ("qwen3_moe", "rollout")])
def test_rloo_under_tensor_parallelism_equals_one_process(name, replay, moe_dirs, tiny_reward_dir, tmp_path):
    """The split actor decodes the rollouts (its routing recorded for moe_routing_replay: rollout)."""
    one, extra = tmp_path / "one", ["--moe_routing_replay", replay]
    done = subprocess.run([sys.executable, *rl_args("rloo", moe_dirs[name], tiny_reward_dir, 1, one), *extra],
                          cwd=REPO, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    rl_run_matches(one, tmp_path, (moe_dirs[name], tiny_reward_dir), "rloo", "tp2", 2, TP2 + extra, 1)
    if replay == "rollout":
        rows = [row for row in read_metrics(tmp_path / "tp2") if "moe/routing_mismatch" in row]
        assert [row["moe/routing_mismatch"] for row in rows] == [
            row["moe/routing_mismatch"] for row in read_metrics(one) if "moe/routing_mismatch" in row] and rows


@pytest.mark.parallel
@pytest.mark.parametrize("name", FAMILIES)
def test_rloo_under_tensor_x_pipeline_parallelism_equals_one_process(name, tiny_model_dir, tiny_reward_dir, tmp_path):
    """tp2 x pp2 (4 processes) on a 4-layer checkpoint with an untied head (tied embeddings are refused there)."""
    actor = family_checkpoint(name, tiny_model_dir, str(tmp_path / name), num_hidden_layers=4,
                              tie_word_embeddings=False)
    one = tmp_path / "one"
    done = subprocess.run([sys.executable, *rl_args("rloo", actor, tiny_reward_dir, 1, one)], cwd=REPO,
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    processes, flags, data_degree = LAYOUTS["tp2xpp2"]
    rl_run_matches(one, tmp_path, (actor, tiny_reward_dir), "rloo", "tp2xpp2", processes, flags, data_degree)


@pytest.mark.parallel
def test_an_expert_size_the_degree_does_not_divide_stops_a_run_in_one_line(moe_dirs, tmp_path):
    shutil.copytree(moe_dirs["qwen3_moe"], tmp_path / "model")
    config = json.load(open(tmp_path / "model" / "config.json"))
    config["moe_intermediate_size"] = 15  # the weights no longer fit: the check comes before them
    json.dump(config, open(tmp_path / "model" / "config.json", "w"))
    logs = launch(tmp_path / "logs", stage_args("sft", str(tmp_path / "model")) + TP2 + [
        "--output_dir", str(tmp_path / "sft")], 2, expect_ok=False)
    assert "moe_intermediate_size 15 is not divisible by tensor_parallel_degree 2 (key 'tensor_parallel_degree')" \
        in logs and "Traceback" not in logs
    assert not (tmp_path / "sft" / "model").exists()
