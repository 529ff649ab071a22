"""Expert parallelism's dispatch and combine (alignment/parallel/expert_parallel.py) in one process: 2 simulated
ranks, each routing its half of the tokens, exchanging rows through the CPU stand-in's selection
(cpu_standins.rows_sent_to, what the gloo all-to-all keeps of the all-gathered rows) and running its half of the
experts, give the dense reference's outputs and gradients (experts, router, hidden states; every expert has one,
zero where no token went, as on the dense path); and the degrees that
cannot split are refused in one line before anything is built. The multi-process runs:
tests/parallel/test_expert_layouts.py."""
import os

import numpy as np
import paddle
import pytest

from alignment.models import LlamaForCausalLM
from alignment.models.moe import moe_blocks
from alignment.parallel.cpu_standins import rows_sent_to
from alignment.parallel.expert_parallel import combine, plan_dispatch, run_local_experts

FIXTURES = os.path.join(os.path.dirname(os.path.dirname(__file__)), "fixtures", "models")
RANKS = 2


def test_rows_sent_to_takes_each_ranks_rows_for_this_rank():
    splits = np.array([[2, 0, 1], [1, 1, 1], [0, 3, 0]])  # [source, destination]
    parts = [paddle.to_tensor([[10.0], [11.0], [12.0]]), paddle.to_tensor([[20.0], [21.0], [22.0]]),
             paddle.to_tensor([[30.0], [31.0], [32.0]])]
    assert rows_sent_to(parts, splits, 0).numpy().ravel().tolist() == [10, 11, 20]
    assert rows_sent_to(parts, splits, 1).numpy().ravel().tolist() == [21, 30, 31, 32]
    assert rows_sent_to(parts, splits, 2).numpy().ravel().tolist() == [12, 22]


def simulated_ranks(block, flat):
    """The block's routed output [n, h] computed as RANKS ranks would: tokens split in halves, experts in halves."""
    halves = paddle.split(flat, RANKS)
    routed = [block.route(part)[1:] for part in halves]  # (chosen, weights) per rank
    experts = block.settings.num_experts
    counts = np.stack([np.bincount(chosen.numpy().reshape(-1), minlength=experts) for chosen, _ in routed])
    plans = [plan_dispatch(chosen.numpy(), counts, rank) for rank, (chosen, _) in enumerate(routed)]
    splits = np.array([plan.send for plan in plans])
    rows = [paddle.gather(part, paddle.to_tensor(plan.tokens)) for part, plan in zip(halves, plans)]
    per_rank = experts // RANKS
    outs = []
    for rank, plan in enumerate(plans):
        assert plan.receive == splits[:, rank].tolist()
        received = rows_sent_to(rows, splits, rank)
        mine = {e: block.experts[e] for e in range(rank * per_rank, (rank + 1) * per_rank)}
        outs.append(run_local_experts(received, plan, mine))
    return paddle.concat([combine(rows_sent_to(outs, splits.T, rank), plan, weights, part.shape[0])
                          for rank, (plan, part, (_, weights)) in enumerate(zip(plans, halves, routed))])


@pytest.mark.parametrize("name", ["qwen3_moe", "ernie4_5_moe"])
def test_two_simulated_ranks_give_the_dense_outputs_and_gradients(name):
    model = LlamaForCausalLM.from_pretrained(os.path.join(FIXTURES, name))
    block = moe_blocks(model)[0]
    paddle.seed(5)
    flat = paddle.randn([12, model.config.hidden_size])
    flat.stop_gradient = False
    results = []
    for simulate in (True, False):
        block.clear_gradients()
        flat.clear_gradient()
        if simulate:
            out = simulated_ranks(block, flat)
        else:
            _, chosen, weights = block.route(flat)
            out = block.dense_experts(flat, chosen, weights)
        (out * paddle.arange(out.shape[1], dtype="float32")).sum().backward()
        results.append((out.numpy(), flat.grad.numpy(), block.gate.weight.grad.numpy(),
                        np.stack([e.down_proj.weight.grad.numpy() for e in block.experts])))  # idle ones: 0
    for simulated, dense in zip(*results):  # within 1e-5 of the largest magnitude, as tests/parallel/test_layouts.py
        np.testing.assert_allclose(simulated, dense, rtol=1e-5, atol=1e-5 * np.abs(dense).max())
    assert np.abs(results[0][2]).max() > 0 and (np.abs(results[0][3]).reshape(8, -1).max(axis=1) > 0).sum() >= 4


def test_experts_that_do_not_split_are_refused_before_anything_is_built():
    with pytest.raises(ValueError, match=r"^\S+config.json: 8 experts are not divisible by expert_parallel_degree 3 "
                                         r"\(key 'expert_parallel_degree'\)$"):
        LlamaForCausalLM.from_pretrained(os.path.join(FIXTURES, "qwen3_moe"), expert_parallel_degree=3)
