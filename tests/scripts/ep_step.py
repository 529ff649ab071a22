"""Run under `python -m paddle.distributed.launch --nproc_per_node W`: an MoE causal LM with its experts split over
expert-parallel groups of `ep` ranks (W / ep data-parallel copies of each group), one training step on a fixed
global batch (BATCH rows, each rank its strided share), then the checkpoint saved (rank 0 writes it whole).

    ep_step.py <model dir> <output dir> <ep>

Writes per rank rank<r>.npz: its rows' logits, replayed logits (every token routed to (own choice + 1) mod E),
its loss (token mean + AUX_COEF x the load-balancing loss), and the averaged gradients of the parameters it holds
under their checkpoint names (Paddle orientation); <output dir>/loaded, the model saved as it was read, and
<output dir>/model, the model after one AdamW step.
tests/parallel/test_expert_layouts.py computes the same in one process (one_process_step) and compares.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from alignment.cpu_env import apply_cpu_defaults  # noqa: E402

apply_cpu_defaults()  # this CPU's thread and MKL settings, before paddle is imported

import numpy as np  # noqa: E402
import paddle  # noqa: E402
import paddle.nn.functional as F  # noqa: E402

from alignment.launcher import rank, world_size  # noqa: E402
from alignment.models import LlamaForCausalLM  # noqa: E402
from alignment.models.moe import moe_blocks, replayed_routing, router_aux_loss, routing_of  # noqa: E402
from alignment.parallel.distributed import average_gradients, init_distributed, shard  # noqa: E402
from alignment.parallel.layout import Layout  # noqa: E402

BATCH, LENGTH, AUX_COEF = 8, 10, 0.5


def batch(vocab):
    return np.random.RandomState(7).randint(0, vocab, size=(BATCH, LENGTH)).astype("int64")


def step(model, ids):
    """Logits, replayed logits and the loss on ids [b, s], backward done (gradients not yet averaged)."""
    model.train()
    experts = model.config.moe.num_experts
    with paddle.no_grad():
        model(ids)
        choices = routing_of(model)  # [b s, sparse layers, k]
        shifted = paddle.to_tensor((choices + 1) % experts).reshape([ids.shape[0], ids.shape[1], *choices.shape[1:]])
        with replayed_routing(model, shifted):
            replayed = model(ids).logits
    logits = model(ids).logits
    token_loss = F.cross_entropy(logits[:, :-1].reshape([-1, logits.shape[-1]]), ids[:, 1:].reshape([-1, 1]))
    loss = token_loss + AUX_COEF * router_aux_loss(model)
    loss.backward()
    return logits, replayed, loss


def optimizer(model):
    return paddle.optimizer.AdamW(learning_rate=0.01, parameters=model.parameters(), epsilon=1.0, weight_decay=0.0)


def named_gradients(model):
    return {name: p.grad.numpy() for name, p in model.named_parameters() if p.grad is not None}


if __name__ == "__main__":
    model_dir, out, ep = sys.argv[1], sys.argv[2], int(sys.argv[3])
    layout = Layout(world=world_size(), expert=ep)
    init_distributed(layout)
    print(layout.describe())
    model = LlamaForCausalLM.from_pretrained(model_dir)
    assert model.config.expert_parallel_degree == ep
    assert len(moe_blocks(model)[0].experts) == model.config.moe.num_experts // ep
    model.save_pretrained(os.path.join(out, "loaded"))  # as read: every rank's experts gathered back
    rows = list(shard(range(BATCH)))
    logits, replayed, loss = step(model, paddle.to_tensor(batch(model.config.vocab_size)[rows]))
    average_gradients(model.parameters())
    np.savez(os.path.join(out, f"rank{rank()}.npz"), rows=np.array(rows), logits=logits.numpy(),
             replayed=replayed.numpy(), loss=float(loss), **{f"grad/{k}": v for k, v in named_gradients(model).items()})
    optimizer(model).step()
    model.save_pretrained(os.path.join(out, "model"))
