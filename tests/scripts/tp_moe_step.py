"""Run under `python -m paddle.distributed.launch --nproc_per_node 2`: an MoE causal LM split over 2 tensor-parallel
ranks, one training step on a fixed batch (every rank the whole batch, as tensor-parallel ranks see the same data),
then the checkpoints saved (rank 0 writes them whole).

    tp_moe_step.py <model dir> <output dir>

Writes per rank rank<r>.npz: the logits, the logits under replayed routing (every token routed to (own choice + 1)
mod E), the routing ([tokens, sparse layers, k]), the loss (token mean + AUX_COEF x the load-balancing loss) and
every gradient gathered whole (Paddle orientation) under its checkpoint name; <output dir>/loaded, the model saved as
it was read, and <output dir>/model, the model after one AdamW step. tests/parallel/test_moe_tensor_parallel.py
computes the same in one process (tests/scripts/ep_step.py's step) and compares.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from alignment.cpu_env import apply_cpu_defaults  # noqa: E402

apply_cpu_defaults()  # this CPU's thread and MKL settings, before paddle is imported

import numpy as np  # noqa: E402
import paddle  # noqa: E402

from alignment.launcher import rank, world_size  # noqa: E402
from alignment.models import LlamaForCausalLM  # noqa: E402
from alignment.models.moe import moe_blocks, routing_of  # noqa: E402
from alignment.parallel import tensor_parallel as tp  # noqa: E402
from alignment.parallel.distributed import grad_norm_squares, init_distributed  # noqa: E402
from alignment.parallel.layout import Layout  # noqa: E402
from tests.scripts.ep_step import batch, optimizer, step  # noqa: E402


def whole_gradients(model):
    """{checkpoint name: the whole gradient} (slices gathered over the group: a collective)."""
    return {name: (tp.gather_along(p.grad, p.split_axis) if tp.is_split(p) else p.grad).numpy()
            for name, p in model.named_parameters() if p.grad is not None}


if __name__ == "__main__":
    model_dir, out = sys.argv[1], sys.argv[2]
    layout = Layout(world=world_size(), tensor=world_size())
    init_distributed(layout)
    print(layout.describe())
    model = LlamaForCausalLM.from_pretrained(model_dir)
    block = moe_blocks(model)[0]
    assert model.config.tensor_parallel_degree == world_size() and block.experts[0].up_proj.weight.shape[1] == \
        model.config.moe.expert_size // world_size()  # each rank a slice of every expert
    model.save_pretrained(os.path.join(out, "loaded"))  # as read: the slices gathered back
    logits, replayed, loss = step(model, paddle.to_tensor(batch(model.config.vocab_size)))
    routing = routing_of(model)
    grads = whole_gradients(model)
    np.savez(os.path.join(out, f"rank{rank()}.npz"), logits=logits.numpy(), replayed=replayed.numpy(),
             routing=routing, loss=float(loss), grad_norm=np.sqrt(grad_norm_squares(model.parameters())),
             **{f"grad/{k}": v for k, v in grads.items()})
    optimizer(model).step()
    model.save_pretrained(os.path.join(out, "model"))
