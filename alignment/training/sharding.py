"""How a trained model and its AdamW are split over the ranks of a sharding group (PaddleNLP's key `sharding`):

    ''       every rank holds the whole model, its gradients and AdamW states (or one sharding rank)
    stage1   each rank keeps the AdamW states of its share of the parameters, updates that share and broadcasts it
             (fleet's DygraphShardingOptimizer)
    stage2   ... and only its share's gradients: each gradient is reduced to its owner during backward (Paddle's
             GroupShardedOptimizerStage2 + GroupShardedStage2: group_sharded_parallel level "os_g")
    stage3   ... and only its slice of every parameter above sharding_segment_size elements, gathered layer by layer
             while the layer runs forward or backward (Paddle's GroupShardedStage3: level "p_g_os")

Stages 2 and 3 are built by paddle.distributed.sharding.group_sharded_parallel, as PaddleNLP's trainer builds them
(sharding group, data-parallel group); on a CPU build by its stand-in (alignment/parallel/cpu_standins.py). One
strategy object per trained model, so the trainer never asks which stage it has:

    before_backward()       called before every backward pass of any trained model
    sync_gradients()        each gradient this rank keeps becomes the data ranks' average
    gradient_norm()         the whole model's gradient L2 norm; clip(max_norm, norm); step(precision)
    held_weights()          the trained tensors this rank holds (the NaN check)
    whole()                 a context in which every parameter holds its whole value (saving, loading)
    owns / accumulators / local_state / state_name    the AdamW state per parameter (training/optimizer_state.py)

Paddle reduces and averages the gradients of stages 2 and 3 itself; the trainer then checks, clips and steps as
for the others, so every stage trains to the same weights as one process.
"""
from __future__ import annotations

import contextlib
import math
from typing import Dict, List

import paddle

from alignment.parallel import sharded
from alignment.parallel.distributed import average_gradients, grad_norm_squares, hybrid_group, sharding_world_size
from alignment.training.optim import clip_tensors

STAGES: Dict[str, type] = {}


class Replicated:
    """Every rank holds everything (no sharding, or plain data parallelism)."""
    stage = ""
    slices_parameters = False  # whether parameters must be gathered to be read whole (a generation copy needs it)

    def __init__(self, model, optimizer, args=None):
        self.model, self.optimizer = model, optimizer

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        STAGES[cls.stage] = cls

    # --- one optimizer step -----------------------------------------------------------------------------------
    def before_backward(self) -> None:
        pass

    def sync_gradients(self) -> None:
        average_gradients(self.model.parameters())

    def gradients(self) -> List:
        """(parameter, gradient) pairs of the gradients every rank holds whole."""
        return [(param, param.grad) for param in self.model.parameters()]

    def partial_gradients(self):
        """(parameter, gradient) pairs of which each sharding rank holds a part of its own (None: no such part)."""
        return None

    def gradient_norm(self) -> float:
        return math.sqrt(grad_norm_squares([p for p, g in self.gradients() if g is not None],
                                           self.partial_gradients()))

    def clip(self, max_norm: float, norm: float) -> None:
        clip_tensors([grad for _, grad in self.gradients() + (self.partial_gradients() or [])], max_norm, norm)

    def step(self, precision) -> None:
        precision.step(self.optimizer)

    def held_weights(self) -> List:
        return [p for p in self.model.parameters() if not p.stop_gradient]

    def whole(self):
        return contextlib.nullcontext()

    def describe(self) -> str:
        """One line for the log: what this stage splits ('' when nothing)."""
        return ""

    # --- the AdamW state of one parameter (training/optimizer_state.py) -----------------------------------------
    @property
    def inner(self):
        """The AdamW behind the sharding wrapper (it holds the moments)."""
        return getattr(self.optimizer, "_inner_opt", self.optimizer)

    def held_states(self) -> List:
        """The AdamW tensors this rank holds (moments, beta powers, master weights)."""
        per_param = [t for states in self.inner._accumulators.values() for t in states.values()]
        return per_param + list(getattr(self.inner, "_master_weights", {}).values())

    def owns(self, param) -> bool:
        """Whether this rank's optimizer updates `param`."""
        return True

    def state_name(self, param) -> str:
        """The name the optimizer keys `param`'s state by."""
        return param.name

    def accumulators(self, param) -> Dict[str, paddle.Tensor]:
        """{accumulator name as in state_dict keys (moment1_0, ...): tensor shaped as `param`} of one parameter."""
        name, out = self.state_name(param), {}
        for per_param in self.inner._accumulators.values():
            tensor = per_param.get(name)
            if tensor is not None:
                out[tensor.name[len(name) + 1:]] = tensor
        master = getattr(self.inner, "_master_weights", {}).get(name)
        if master is not None:
            out["master_weight"] = master
        return out

    def local_state(self, param, value: paddle.Tensor) -> paddle.Tensor:
        """What this rank keeps of an accumulator `value` shaped as `param` (or a [1] beta power)."""
        return value


class OptimizerStates(Replicated):
    stage = "stage1"

    def __init__(self, model, optimizer, args=None):
        from paddle.distributed import fleet
        from paddle.distributed.fleet.meta_optimizers.dygraph_optimizer.dygraph_sharding_optimizer import \
            DygraphShardingOptimizer

        super().__init__(model, DygraphShardingOptimizer(optimizer, fleet.get_hybrid_communicate_group()))

    def describe(self) -> str:
        trained = sum(1 for p in self.model.parameters() if not p.stop_gradient)
        return f"sharding {self.stage}: {self.split} of {trained} trained parameter tensors split over " \
               f"{sharding_world_size()} ranks"

    split = "the AdamW states"

    def owns(self, param) -> bool:
        return self.optimizer._param2rank.get(param.name) == hybrid_group().get_sharding_parallel_rank()


def group_sharded(model, optimizer, level: str, **options):
    """paddle.distributed.sharding.group_sharded_parallel over the hybrid groups, or its CPU stand-in."""
    if paddle.is_compiled_with_cuda() or paddle.is_compiled_with_xpu():
        from paddle.distributed.sharding import group_sharded_parallel
    else:
        from alignment.parallel.cpu_standins import group_sharded_parallel
    hcg = hybrid_group()
    wrapper, optimizer, _ = group_sharded_parallel(model, optimizer, level, group=hcg.get_sharding_parallel_group(),
                                                   dp_group=hcg.get_data_parallel_group(), **options)
    return wrapper, optimizer


class Gradients(Replicated):
    """Stage 2. Paddle's wrapper resets its per-backward reduction in its forward; the losses here call the
    backbone and the head, not the wrapper, so before_backward does it. Its optimizer's step (as the wrapper
    redefines it) averages the owned gradients first: sync_gradients runs that part, so the gradients can be
    checked and clipped before the class's own step."""
    stage = "stage2"

    def __init__(self, model, optimizer, args=None):
        self.wrapper, optimizer = group_sharded(model, optimizer, "os_g")
        super().__init__(model, optimizer)

    def before_backward(self) -> None:
        self.wrapper._init_internal_storage(needs_fresh=not self.wrapper._bw_hooks)

    def sync_gradients(self) -> None:
        self.wrapper._grad_scale()  # 1 / ranks of the sharding and data groups
        self.wrapper._dp_allreduce()

    def gradients(self) -> List:
        return []

    def partial_gradients(self):
        w = self.wrapper
        return [(p, p.grad) for p in w._trainable_params if w._trainable_param2rank.get(p.name) == w._rank
                and p.grad is not None and p.grad._is_initialized()]

    def step(self, precision) -> None:
        type(self.optimizer).step(self.optimizer)  # the update and the broadcast, not the gradient averaging again

    describe = OptimizerStates.describe
    split = "the gradients and AdamW states"

    @property
    def inner(self):
        return self.optimizer._optim

    def owns(self, param) -> bool:
        return self.optimizer.param2rank.get(param.name) == self.optimizer._rank


class Parameters(Replicated):
    """Stage 3. Layers gather their parameters synchronously (sync_comm): Paddle's prefetch of the next layer
    assumes every forward runs the same layers in the same order, and scoring runs the backbone without the head.
    A tied embedding table stays whole (the head reads it outside the embedding layer)."""
    stage = "stage3"
    slices_parameters = True

    def __init__(self, model, optimizer, args=None):
        head_reads_table = getattr(model.config, "tie_word_embeddings", False) and not hasattr(model, "lm_head") \
            and hasattr(model, "compute_logits")
        exclude = [id(model.model.embed_tokens)] if head_reads_table else []
        self.wrapper, optimizer = group_sharded(model, optimizer, "p_g_os", sync_comm=True, exclude_layer=exclude,
                                                segment_size=args.sharding_segment_size)
        super().__init__(model, optimizer)
        self.sliced = [p for p in model.parameters() if sharded.is_sliced(p)]

    def sync_gradients(self) -> None:
        for param in self.sliced:  # a model without a backward this step updates on zero gradients, as elsewhere
            if not param.stop_gradient and param.bw_storage is None:
                param.bw_storage = paddle.zeros_like(param.fw_storage)
        self.optimizer.update_slice()  # Paddle's pre-step: slices become the optimizer's parameters, small
        self.optimizer.update_scaler = True  # parameters' gradients are averaged; step() does not repeat it

    def gradients(self) -> List:
        return [(p, p.grad) for p in self.model.parameters() if not p.stop_gradient and not sharded.is_sliced(p)]

    def partial_gradients(self):
        return [(p, p.fw_storage.grad) for p in self.sliced if not p.stop_gradient]

    def held_weights(self) -> List:
        return [p.fw_storage if sharded.is_sliced(p) else p for p in self.model.parameters() if not p.stop_gradient]

    def whole(self):
        return sharded.whole_parameters(self.sliced)

    def describe(self) -> str:
        params = self.model.parameters()
        share = sum(p._numel() for p in self.sliced) / max(1, sum(p._numel() for p in params))
        return f"sharding stage3: {len(self.sliced)} of {len(params)} parameter tensors ({100 * share:.1f}% of the " \
               f"elements) split over {sharding_world_size()} ranks, with their gradients and AdamW states; the " \
               "rest whole on each"

    def state_name(self, param) -> str:
        return sharded.SLICE_PREFIX + param.name if sharded.is_sliced(param) else param.name

    def accumulators(self, param) -> Dict[str, paddle.Tensor]:
        out = super().accumulators(param)
        if sharded.is_sliced(param):
            out = {k: v if v.shape == [1] else sharded.gather_flat(v, param._numel(), param.shape)
                   for k, v in sorted(out.items())}
        return out

    def local_state(self, param, value: paddle.Tensor) -> paddle.Tensor:
        if not sharded.is_sliced(param) or value.shape == [1]:
            return value
        return sharded.local_flat(value, param.fw_storage._numel())


def shard(model, optimizer, args) -> Replicated:
    """The strategy of `args.sharding` for `model` and its AdamW (Replicated with one sharding rank)."""
    stage = args.sharding.split()[0] if args.sharding.strip() and sharding_world_size() > 1 else ""
    return STAGES[stage](model, optimizer, args)


STAGES[""] = Replicated
