"""Expert parallelism: each MoE layer's experts split over the ranks of an expert-parallel group (rank r of P holds
experts [r E/P, (r + 1) E/P)), each token's copies sent to the ranks holding its chosen experts and the results sent
back (key expert_parallel_degree; the groups: alignment/parallel/distributed.py).

One forward of an expert layer on each rank of the group (all of them call it, in step):
1. every rank's per-expert counts of its (token, slot) choices are all-gathered: [P, E], from which every rank
   knows how many rows it sends to and receives from each other rank;
2. dispatch: the copies sorted by expert (so by destination rank), their hidden states exchanged all-to-all;
3. each local expert runs on the rows it received (grouped by source rank, then expert);
4. combine: the outputs exchanged back all-to-all (the reverse splits), weighted by the router's weights on the
   token's own rank and summed per token in expert order, as one process's sparse path sums them.

The all-to-all is a PyLayer whose backward is the reverse all-to-all, so an expert's weights get the gradient of
every token routed to it (from any rank) and each token's hidden state gets its experts' gradients back. On a GPU it
is paddle.distributed.alltoall_single; gloo has no all-to-all ("ProcessGroupGLOO does not support all_to_all"), so
a CPU build uses the stand-in of alignment/parallel/cpu_standins.py (all_gather, then each rank's own rows).
"""
from __future__ import annotations

from typing import Dict, List, NamedTuple, Tuple

import numpy as np
import paddle
import paddle.distributed as dist
from paddle.autograd import PyLayer

from alignment.parallel import tensor_parallel as tp


class Dispatch(NamedTuple):
    """One rank's plan for one forward: its copies in expert order and the rows it exchanges."""
    order: np.ndarray  # [n k] indices into the flattened [n, k] choices, sorted by expert (stable)
    tokens: np.ndarray  # [n k] the token of each sorted copy
    send: List[int]  # copies this rank sends to each rank
    receive: List[int]  # rows this rank receives from each rank
    local: List[Tuple[int, np.ndarray]]  # (local expert, the received rows routed to it)


def plan_dispatch(picks: np.ndarray, counts: np.ndarray, me: int) -> Dispatch:
    """picks [n, k]: this rank's chosen experts; counts [P, E]: every rank's per-expert copy counts."""
    ranks, experts = counts.shape
    per_rank = experts // ranks
    flat = picks.reshape(-1)
    order = np.argsort(flat, kind="stable")
    by_rank = counts.reshape(ranks, ranks, per_rank)  # [source, destination, expert of the destination]
    received = by_rank[:, me, :]  # [source, local expert]: rows arrive by source, then by expert
    starts = np.concatenate([[0], np.cumsum(received.reshape(-1))[:-1]]).reshape(received.shape)
    local = []
    for j in range(per_rank):
        rows = np.concatenate([np.arange(starts[s, j], starts[s, j] + received[s, j]) for s in range(ranks)])
        local.append((me * per_rank + j, rows.astype("int64")))
    return Dispatch(order, order // picks.shape[1], by_rank[me].sum(axis=1).tolist(),
                    received.sum(axis=1).tolist(), local)


def run_local_experts(received, plan: Dispatch, experts: Dict[int, paddle.nn.Layer]):
    """The outputs of this rank's experts on the rows it received, in the received order."""
    out = paddle.zeros_like(received)
    for expert, rows in plan.local:
        if len(rows):
            index = paddle.to_tensor(rows)
            out = paddle.index_add(out, index, 0, experts[expert](paddle.gather(received, index)))
        elif paddle.is_grad_enabled():
            out = out + idle_term(experts[expert], received)
    return out


def idle_term(expert, like):
    """0 x an expert's output on a zero row, added while gradients are recorded: an expert no token reached still
    gets a (zero) gradient, as on the dense path, so which experts the optimizer steps does not depend on
    which tokens (padding included) each rank happens to route; under expert parallelism the ranks holding the same
    expert then all take part in summing its gradient."""
    return 0.0 * expert(paddle.zeros([1, like.shape[1]], like.dtype)).sum()


def combine(back, plan: Dispatch, weights, tokens: int):
    """The outputs back on the token's rank [n k, h] (sorted order) -> [n, h]: weighted and summed per token."""
    weight = paddle.gather(weights.reshape([-1]), paddle.to_tensor(plan.order))
    out = paddle.zeros([tokens, back.shape[1]], back.dtype)
    return paddle.index_add(out, paddle.to_tensor(plan.tokens), 0, back * weight.unsqueeze(-1))


def alltoall_rows(rows, send: List[int], receive: List[int], group):
    """Rows [sum(send), ...] split over the ranks by `send` -> the rows [sum(receive), ...] the ranks send here."""
    out = paddle.empty([int(sum(receive))] + list(rows.shape[1:]), rows.dtype)
    if paddle.is_compiled_with_cuda():
        dist.alltoall_single(out, rows, out_split_sizes=receive, in_split_sizes=send, group=group)
    else:
        from alignment.parallel import cpu_standins

        cpu_standins.alltoall_single(out, rows, out_split_sizes=receive, in_split_sizes=send, group=group)
    return out


class Exchange(PyLayer):
    """Forward: all-to-all of rows (send/receive splits). Backward: the reverse all-to-all of the gradient."""

    @staticmethod
    def forward(ctx, rows, send, receive, group):
        ctx.splits = (send, receive, group)
        return alltoall_rows(rows, send, receive, group)

    @staticmethod
    def backward(ctx, grad):
        send, receive, group = ctx.splits
        return alltoall_rows(grad.contiguous(), receive, send, group)


def expert_counts(picks: np.ndarray, experts: int, group) -> np.ndarray:
    """[P, E]: how many (token, slot) choices each rank of `group` made of each expert (a collective)."""
    counts = []
    dist.all_gather(counts, paddle.to_tensor(np.bincount(picks.reshape(-1), minlength=experts), "int64"),
                    group=group)
    return np.stack([c.numpy() for c in counts])


def parallel_experts(flat, chosen, weights, experts: Dict[int, paddle.nn.Layer], num_experts: int, group):
    """The expert block's routed output [n, h] for this rank's tokens flat [n, h] with choices chosen [n, k] and
    weights [n, k], its local `experts` {global index: layer} (a collective over `group`)."""
    picks = chosen.numpy()
    plan = plan_dispatch(picks, expert_counts(picks, num_experts, group), group.rank)
    rows = paddle.gather(flat, paddle.to_tensor(plan.tokens))
    received = Exchange.apply(rows, plan.send, plan.receive, group)
    back = Exchange.apply(run_local_experts(received, plan, experts), plan.receive, plan.send, group)
    return combine(back, plan, weights, flat.shape[0])


def gather_experts(experts: Dict[int, paddle.nn.Layer], group) -> Dict[str, paddle.Tensor]:
    """{"<expert>.<parameter>": whole tensor} of every expert of the group's ranks (a collective; each rank's
    experts stacked per parameter and all-gathered)."""
    local = sorted(experts)
    names = [name for name, _ in experts[local[0]].named_parameters()]
    out = {}
    for name in names:
        params = [dict(experts[e].named_parameters())[name] for e in local]  # tensor-parallel slices made whole
        stacked = paddle.stack([tp.full_tensor(p) if tp.is_split(p) else p.detach() for p in params])
        parts = []
        dist.all_gather(parts, stacked, group=group)
        for rank, part in enumerate(parts):
            for j in range(len(local)):
                out[f"{rank * len(local) + j}.{name}"] = part[j]
    return out
