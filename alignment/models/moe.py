"""Mixture-of-experts MLP for the Qwen3-MoE and ERNIE 4.5 MoE families (settings: alignment/config/moe_keys.py).

A router (`gate`, a bias-free Linear hidden -> experts) gives each token softmax probabilities over the experts; the
top-k experts run on it and their outputs are summed with the chosen probabilities as weights:
- Qwen3-MoE: top-k of the probabilities; the k weights divided by their sum when `norm_topk_prob`.
- ERNIE 4.5 MoE: top-k of the probabilities plus `e_score_correction_bias` (a per-expert bias that moves the choice,
  not the weights); the weights divided by their sum clamped below at `moe_norm_min`; plus shared experts, one
  SwiGLU of `moe_intermediate_size x moe_num_shared_experts` that every token runs.
Each expert is a SwiGLU with transformers' checkpoint names (`mlp.experts.3.gate_proj.weight`), so checkpoints
convert like the dense layers (a transpose) and LoRA's gate_proj/up_proj/down_proj targets reach the experts too.

Two paths, equal up to float rounding: sparse (each expert runs on the tokens routed to it, gathered, and its
outputs are added back in expert order, as transformers does; an expert no token reached runs on a zero row times
0 while gradients are recorded, so every expert has a gradient every step, as on the dense path and whatever the
padding of each rank's batch) and dense (every expert on every token, the outputs
weighted by a [tokens, experts] matrix that is zero off the chosen experts): the reference, and what a compiled
program runs (no data-dependent shapes). Each forward keeps its router logits and choices on the block, for the
load-balancing loss (router_aux_loss, as transformers computes it), the expert load, and routing replay: a block
given `replay` choices [tokens, k] uses them instead of its own top-k (weights from its own probabilities).

Under expert parallelism (config.expert_parallel_degree > 1) a block holds only its rank's experts, in a LayerDict
under their global indices (so names stay `mlp.experts.5.up_proj.weight`), and its tokens travel to the ranks that
hold their chosen experts (alignment/parallel/expert_parallel.py); routing, the shared experts and the router stay
on the token's rank. The load-balancing loss then counts every data rank's tokens, as one process over the whole
batch would; saving gathers every expert (whole_experts), loading reads this rank's.

Under tensor parallelism (config.tensor_parallel_degree > 1) every rank holds a slice of every expert and of the
shared experts (moe_experts.py), the router whole; the block's output is one sum over the group (MoeBlock.forward).
Expert parallelism with tensor parallelism is refused (alignment/parallel/layout.py).
"""
from __future__ import annotations

import contextlib
from typing import List, Optional

import numpy as np
import paddle
import paddle.nn as nn
import paddle.nn.functional as F

from alignment.models.config import LlamaConfig
from alignment.models.moe_experts import ScoreCorrection, SwiGLU
from alignment.parallel import tensor_parallel as tp
from alignment.parallel.distributed import data_world_size, expert_parallel_group, sum_over_data_ranks
from alignment.parallel.expert_parallel import gather_experts, idle_term, parallel_experts


class MoeBlock(nn.Layer):
    def __init__(self, config: LlamaConfig):
        super().__init__()
        moe = config.moe
        self.settings = moe
        self.degree = config.tensor_parallel_degree  # each expert split over the ranks (moe_experts.py)
        self.gate = tp.column_linear(config.hidden_size, moe.num_experts, False, 1)  # replicated
        degree = getattr(config, "expert_parallel_degree", 1)
        self.group = expert_parallel_group() if degree > 1 else None  # expert parallelism: this rank's group
        if self.group is None:
            self.experts = nn.LayerList([SwiGLU(config.hidden_size, moe.expert_size, False, self.degree)
                                         for _ in range(moe.num_experts)])
        else:
            if self.group.nranks != degree:
                raise ValueError(f"expert_parallel_degree {degree}: the process group has {self.group.nranks} "
                                 "ranks (key 'expert_parallel_degree')")
            per_rank = moe.num_experts // degree
            mine = range(self.group.rank * per_rank, (self.group.rank + 1) * per_rank)
            self.experts = nn.LayerDict({str(e): SwiGLU(config.hidden_size, moe.expert_size, False, self.degree)
                                         for e in mine})  # (and each a tensor-parallel slice under tp > 1)
            for param in self.experts.parameters():
                param.expert_parallel = True  # gradients averaged over the ranks holding the same experts
                param.no_sync = True  # fleet's start-up broadcast over data ranks skips it (Paddle's MoE mark)
        self.moe_statics = ScoreCorrection(moe.num_experts) if moe.score_correction else None
        self.shared_experts = SwiGLU(config.hidden_size, moe.shared_size, config.mlp_bias, self.degree) \
            if moe.shared_size else None
        self.dense = False  # the reference path (every expert on every token)
        self.replay: Optional[paddle.Tensor] = None  # [tokens, k] int64 expert choices to use instead of top-k
        self.router_logits: Optional[paddle.Tensor] = None  # [tokens, experts] of the last forward
        self.chosen: Optional[paddle.Tensor] = None  # [tokens, k] of the last forward
        self.own_choice: Optional[paddle.Tensor] = None  # [tokens, k] the router's own top-k under replay
        self.trace: Optional[list] = None  # a compiled program's list its choices go to (static_decode.py)

    def route(self, flat):
        """flat [n, hidden] -> (router logits [n, E] float32, chosen experts [n, k] int64, their weights [n, k])."""
        logits = self.gate(flat).astype("float32")
        probs = F.softmax(logits, axis=-1)
        scores = probs + self.moe_statics.e_score_correction_bias if self.moe_statics is not None else probs
        chosen = paddle.topk(scores, self.settings.top_k, axis=-1)[1]
        if self.replay is not None:  # -1 rows (nothing recorded there) keep their own choice
            if self.replay.shape != chosen.shape:
                raise ValueError(f"routing replay: choices for {self.replay.shape[0]} tokens, the forward has "
                                 f"{chosen.shape[0]} (replay runs the rows and columns that were recorded)")
            self.own_choice, chosen = chosen, paddle.where(self.replay >= 0, self.replay, chosen)
        weights = paddle.take_along_axis(probs, chosen, axis=-1)
        if self.settings.normalize_top_k:
            weights = weights / paddle.clip(weights.sum(axis=-1, keepdim=True), min=self.settings.norm_min)
        return logits, chosen, weights.astype(flat.dtype)

    def forward(self, x):
        """x [b, s, hidden] -> [b, s, hidden]. Under tensor parallelism every rank routes the same (replicated)
        tokens with the same (replicated) router, so the choices and weights are the same on every rank; each rank
        runs its slice of the chosen experts and the partial outputs, weighted, are summed over the group once.
        Each rank's gradient of the weights holds only its slices' part, so it is summed over the group
        (gradient_summed_over_group), and then the router's gradient is whole and the same on every rank; the
        load-balancing loss reads the router logits directly (its gradient already whole: not summed again, which
        is why the router's weight is not summed as Qwen3's q/k norms are). The experts' input likewise gets its
        gradient summed over the group, as a column-parallel layer's does."""
        b, s, hidden = x.shape
        flat = x.reshape([-1, hidden])
        logits, chosen, weights = self.route(flat)
        if self.trace is not None:  # inside a program being compiled: its choices become one of its outputs
            self.trace.append(chosen)
        else:
            self.router_logits, self.chosen = logits, chosen
        weights = tp.gradient_summed_over_group(weights, self.degree)  # [n, k]
        inputs = tp.gradient_summed_over_group(flat, self.degree)  # [n, hidden], the experts' input
        if self.group is not None:
            if self.dense or not paddle.in_dynamic_mode():
                raise ValueError("the dense expert path (reference, compiled programs) needs every expert on one "
                                 "rank: expert_parallel_degree 1")
            out = parallel_experts(inputs, chosen, weights, self.local_experts(), self.settings.num_experts,
                                   self.group)
        elif self.dense or not paddle.in_dynamic_mode():
            out = self.dense_experts(inputs, chosen, weights)
        else:
            out = self.sparse_experts(inputs, chosen, weights)
        if self.shared_experts is not None:
            out = out + self.shared_experts(inputs)
        out = tp.summed_over_group(out, self.degree)  # [n, hidden]: one all-reduce for every expert's slices
        late = self.shared_experts.deferred_bias() if self.shared_experts is not None else None
        return (out if late is None else out + late).reshape([b, s, hidden])

    @contextlib.contextmanager
    def replaying(self, choices: paddle.Tensor):
        """Forwards inside route their tokens to choices [tokens, k] (-1: the token's own) instead of the top-k."""
        self.replay = choices
        try:
            yield
        finally:
            self.replay = self.own_choice = None

    def local_experts(self) -> dict:
        """{global expert index: its layer} of the experts this rank holds (all of them without parallelism)."""
        if self.group is None:
            return dict(enumerate(self.experts))
        return {int(name): layer for name, layer in self.experts.items()}

    def dense_experts(self, flat, chosen, weights):
        combine = paddle.put_along_axis(paddle.zeros([flat.shape[0], len(self.experts)], flat.dtype), chosen,
                                        weights, axis=1)  # [n, E], zero off the chosen experts
        out = paddle.zeros_like(flat)
        for e, expert in enumerate(self.experts):
            out = out + expert(flat) * combine[:, e:e + 1]
        return out

    def sparse_experts(self, flat, chosen, weights):
        picks = chosen.numpy()
        out = paddle.zeros_like(flat)
        for e, expert in enumerate(self.experts):
            rows, slots = np.nonzero(picks == e)
            if not len(rows):
                if paddle.is_grad_enabled():  # decoding adds nothing
                    out = out + idle_term(expert, flat)  # a zero gradient, as on the dense path
                continue
            index = paddle.to_tensor(rows, dtype="int64")
            weight = paddle.gather_nd(weights, paddle.to_tensor(np.stack([rows, slots], axis=1), dtype="int64"))
            out = paddle.index_add(out, index, 0, expert(paddle.gather(flat, index)) * weight[:, None])
        return out


def moe_block(config: LlamaConfig, index: int) -> Optional[MoeBlock]:
    """The expert block of decoder layer `index`, None where the family's layer is dense."""
    moe = config.moe
    if moe is None or index not in moe.sparse_layers:
        return None
    return MoeBlock(config)  # the sizes checked to split before (config.check_tensor_split)


def moe_blocks(model) -> List[MoeBlock]:
    """The expert blocks of `model` in layer order (none for a dense model, or a stand-in that is no Layer)."""
    return [layer for layer in model.sublayers() if isinstance(layer, MoeBlock)] if isinstance(model, nn.Layer) else []


def use_dense_experts(model: nn.Layer, dense: bool = True) -> None:
    """Every expert block of `model` on the dense (reference) path, or back on the sparse one."""
    for block in moe_blocks(model):
        block.dense = dense


def router_aux_loss(model: nn.Layer, attention_mask=None, grad_scale: Optional[float] = None) -> paddle.Tensor:
    """transformers' load_balancing_loss_func over the last forward's sparse layers: experts x sum over experts of
    (the share of top-k choices it got) x (its mean router probability), over all layers' tokens together; with
    attention_mask [b, s] only the real tokens count. The choice is the plain top-k of the probabilities (no score
    correction, no replay), as there. Under expert parallelism the counts, probability sums and rows are every data
    rank's (a collective): the value is one process's over the whole batch, and each rank's share of its gradient is
    scaled by `grad_scale` (default: the number of data ranks, whose average the gradients then take)."""
    blocks = moe_blocks(model)
    experts, top_k = blocks[0].settings.num_experts, blocks[0].settings.top_k
    counts = paddle.zeros([experts], "float32")
    prob_sum = paddle.zeros([experts], "float32")
    rows = paddle.zeros([], "float32")
    for block in blocks:
        probs = F.softmax(block.router_logits, axis=-1)  # [n, E]
        chosen = paddle.topk(probs, top_k, axis=-1)[1]
        hits = F.one_hot(chosen, experts).sum(axis=1)  # [n, E]
        if attention_mask is None:
            rows = rows + float(probs.shape[0])
        else:
            mask = attention_mask.reshape([-1, 1]).astype("float32")
            hits, probs = hits * mask, probs * mask
            rows = rows + mask.sum()
        counts = counts + hits.sum(axis=0)
        prob_sum = prob_sum + probs.sum(axis=0)
    if blocks[0].group is not None:
        totals = sum_over_data_ranks(paddle.concat([counts, prob_sum.detach(), rows.reshape([1])]))
        counts, rows = totals[:experts], totals[-1]
        scale = data_world_size() if grad_scale is None else grad_scale
        prob_sum = totals[experts:-1] + (prob_sum - prob_sum.detach()) * scale
    return (counts / rows * (prob_sum / rows)).sum() * experts


def whole_experts(model: nn.Layer) -> dict:
    """{checkpoint name: whole tensor (Paddle orientation)} of every expert of every expert-parallel block of
    `model`, gathered from the ranks of its group (a collective; {} without expert parallelism)."""
    out = {}
    for prefix, block in _parallel_blocks(model):
        out.update({f"{prefix}experts.{name}": tensor
                    for name, tensor in gather_experts(block.local_experts(), block.group).items()})
    return out


def held_experts(model: nn.Layer) -> str:
    """What this rank holds of an expert-parallel model's experts, for the log ('' without expert parallelism)."""
    blocks = _parallel_blocks(model)
    if not blocks:
        return ""
    mine = sorted(blocks[0][1].local_experts())
    return f"experts {mine[0]}-{mine[-1]} of {blocks[0][1].settings.num_experts} in each of its {len(blocks)} " \
           "sparse layers"


def experts_elsewhere(model: nn.Layer) -> set:
    """The checkpoint names of the expert parameters other ranks of each block's expert-parallel group hold."""
    names = set()
    for prefix, block in _parallel_blocks(model):
        mine = block.local_experts()
        params = [name for name, _ in next(iter(mine.values())).named_parameters()]
        names.update(f"{prefix}experts.{e}.{p}" for e in range(block.settings.num_experts) if e not in mine
                     for p in params)
    return names


def _parallel_blocks(model):
    return [(f"{name}." if name else "", layer) for name, layer in model.named_sublayers(include_self=True)
            if isinstance(layer, MoeBlock) and layer.group is not None]


def expert_load(model: nn.Layer) -> List[np.ndarray]:
    """Per sparse layer, the share of the last forward's top-k choices each expert got ([experts], sums to 1)."""
    out = []
    for block in moe_blocks(model):
        counts = np.bincount(block.chosen.numpy().reshape(-1), minlength=block.settings.num_experts)
        out.append(counts / counts.sum())
    return out


def routing_of(model: nn.Layer) -> Optional[np.ndarray]:
    """The last forward's choices, [tokens, sparse layers, k] int64; None for a dense model."""
    blocks = moe_blocks(model)
    return np.stack([block.chosen.numpy() for block in blocks], axis=1) if blocks else None


@contextlib.contextmanager
def replayed_routing(model: nn.Layer, experts: paddle.Tensor):
    """Forwards of `model` over [N, W] tokens use the choices experts [N, W, sparse layers, k] (generate's record;
    -1: the token's own choice) instead of their own top-k; the weights stay the model's probabilities."""
    blocks = moe_blocks(model)
    n, width, layers, k = experts.shape
    if layers != len(blocks):
        raise ValueError(f"routing replay: choices for {layers} sparse layers, the model has {len(blocks)}")
    try:
        for j, block in enumerate(blocks):
            block.replay = experts[:, :, j].reshape([n * width, k])
        yield
    finally:
        for block in blocks:
            block.replay = block.own_choice = None


def routing_mismatch(model: nn.Layer) -> float:
    """Under replay, the share of the replayed (token, sparse layer) pairs whose recorded experts differ from the
    set the router would have chosen itself in the last forward: how often the sampler's and the trainer's routing
    disagree (0 when they agree everywhere)."""
    differs, total = 0, 0
    for block in moe_blocks(model):
        recorded = block.replay.numpy()  # [tokens, k]
        rows = (recorded >= 0).all(axis=1)
        own = np.sort(block.own_choice.numpy()[rows], axis=1)
        differs += int((own != np.sort(recorded[rows], axis=1)).any(axis=1).sum())
        total += int(rows.sum())
    return differs / total if total else 0.0


def moe_training_terms(model: nn.Layer, attention_mask=None, weight: Optional[float] = None):
    """What a training step adds for an MoE model after its forward: (router_aux_loss_coef x the load-balancing
    loss when the config's output_router_logits is set, as transformers adds it to its loss, else None; metrics:
    moe/aux_loss and, per sparse layer j, moe/max_expert_load/j, the largest share of choices one expert got).
    weight: this rank's weight of the micro-batch (its tokens), by whose share of the data ranks' weight the
    trainer scales the loss; under expert parallelism the term's gradient is scaled by the inverse, so the data
    ranks' gradients add up to one process's (a collective)."""
    blocks = moe_blocks(model)
    if not blocks or blocks[0].router_logits is None:
        return None, {}
    scale = None
    if weight is not None and blocks[0].group is not None:
        scale = float(sum_over_data_ranks(paddle.to_tensor(float(weight), "float32"))) / max(float(weight), 1e-12)
    aux = router_aux_loss(model, attention_mask, scale)
    metrics = {"moe/aux_loss": float(aux)}
    metrics.update({f"moe/max_expert_load/{j}": float(share.max()) for j, share in enumerate(expert_load(model))})
    settings = blocks[0].settings
    return (settings.aux_loss_coef * aux if settings.output_router_logits else None), metrics
