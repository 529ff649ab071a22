"""Expert parallelism on 2 and 4 CPU processes (gloo) against one process: Qwen3-MoE (top-k normalised, no shared
experts) and ERNIE 4.5 MoE (score correction, shared experts) with their 8 experts split over ep=2 ranks, alone
(2 processes) and with 2 data-parallel copies (ep2 x dp2, 4 processes: the experts' gradients are summed over the
ranks that hold them). One step of tests/scripts/ep_step.py on a fixed global batch: logits, replayed logits (MoE
routing replay), the loss with the load-balancing term, every gradient and the weights after one AdamW step equal
one process's within 1e-5 of each tensor's largest magnitude (as tests/test_layouts.py); the checkpoint saved under
ep=2 is whole (the HF layout: it loads in one process), read from the one-process checkpoint. Marked `parallel`."""
import os
import subprocess
import sys

import numpy as np
import paddle
import pytest

from alignment.models import LlamaForCausalLM
from tests.helpers import REPO
from tests.scripts.ep_step import BATCH, batch, named_gradients, optimizer, step

pytestmark = pytest.mark.parallel

FIXTURES = os.path.join(os.path.dirname(__file__), "fixtures", "models")
LAYOUTS = {"ep2": 2, "ep2xdp2": 4}  # name: processes (expert_parallel_degree 2)


def launch(log_dir, args, nproc):
    cmd = [sys.executable, "-m", "paddle.distributed.launch", "--nproc_per_node", str(nproc), "--log_dir",
           str(log_dir), *args]
    done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=600)
    logs = "".join(open(os.path.join(log_dir, f)).read() for f in sorted(os.listdir(log_dir))
                   if f.startswith("workerlog"))
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:] + logs[-4000:]
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
