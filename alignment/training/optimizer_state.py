"""AdamW state in a layout-free form, so a step checkpoint resumes under any process layout.

Every accumulator is stored whole, under the whole model's parameter name and Paddle's orientation:

    "<parameter>/<accumulator>"  e.g.  "model.layers.0.self_attn.q_proj.weight/moment1_0"   (shape of the weight)
                                       "model.layers.0.self_attn.q_proj.weight/beta1_pow_acc_0"   ([1])

Saving gathers tensor-parallel slices along their split axis, takes each pipeline stage's parameters under the
whole model's names and each sharding rank's own parameters; loading gives every rank the slice of the
parameters it holds, and under sharding only those its optimizer owns (stage 3: its slice of each). So tp2 x pp2 x
dp2 -> one process and one process -> tp2 x sharding2 both continue where the checkpoint stopped. Under expert
parallelism each rank holds its experts' states; saving gathers them all, loading keeps this rank's. What a sharding
stage keeps of a state is its strategy's (training/sharding.py; a bare optimizer counts as unsharded).
"""
from __future__ import annotations

from typing import Dict

import numpy as np
import paddle

from alignment.parallel import tensor_parallel as tp
from alignment.parallel.distributed import (expert_parallel_degree, gather_objects, hybrid_group, rank,
                                            split_optimizer_states)
from alignment.training.sharding import Replicated

SEPARATOR = "/"


def canonical_parameters(model) -> Dict[str, paddle.Tensor]:
    """{whole-model parameter name: this rank's parameter}: pipeline stages name theirs as the whole model does."""
    return model.hf_names() if hasattr(model, "hf_names") else dict(model.named_parameters())


def _strategy(model, optimizer) -> Replicated:
    """The sharding strategy of `optimizer` (itself when it is one)."""
    return optimizer if isinstance(optimizer, Replicated) else Replicated(model, optimizer)


def whole_optimizer_state(model, optimizer) -> Dict[str, np.ndarray]:
    """The whole AdamW state of `model` as host arrays, on every rank (rank 0 writes it). A collective: every rank
    calls it. `optimizer`: the AdamW, or the sharding strategy that holds it."""
    sharding, local = _strategy(model, optimizer), {}
    for name, param in sorted(canonical_parameters(model).items()):
        if getattr(param, "tied_copy", False):
            continue  # a pipeline stage's second copy of a tied table: the first stage's state is the same
        accumulators = sharding.accumulators(param) if sharding.owns(param) else {}
        for key, tensor in sorted(accumulators.items()):
            if tp.is_split(param) and list(tensor.shape) == list(param.shape):
                tensor = tp.gather_along(tensor, param.split_axis)  # every rank of the tensor-parallel group
            local[f"{name}{SEPARATOR}{key}"] = tensor.numpy()
    if split_optimizer_states():
        group = hybrid_group()
        # the first data rank of each sharding rank (with expert parallelism the first expert-parallel group's,
        # which holds every expert)
        contributes = group.get_data_parallel_rank() < expert_parallel_degree() and \
            group.get_model_parallel_rank() == 0
    elif expert_parallel_degree() > 1:
        contributes = rank() < expert_parallel_degree()  # the first expert-parallel group holds every expert
    else:
        return local  # plain data parallelism: every rank holds the same whole state
    merged = {}
    for part in gather_objects(local if contributes else {}):
        merged.update(part)
    return merged


def load_whole_optimizer_state(model, optimizer, tensors: Dict[str, np.ndarray], source: str) -> None:
    """Set this rank's share of a whole state into `optimizer` (the AdamW or its sharding strategy; before or
    after its first step)."""
    sharding, state = _strategy(model, optimizer), {}
    for name, param in canonical_parameters(model).items():
        if param.stop_gradient or not sharding.owns(param):
            continue  # frozen (e.g. LoRA's base weights), or another sharding rank's
        prefix = f"{name}{SEPARATOR}"
        keys = [k for k in tensors if k.startswith(prefix)]
        if not keys and tensors:  # (an optimizer that never stepped has no state at all)
            raise ValueError(f"{source}: no optimizer state for parameter {name}; the checkpoint belongs to "
                             "another model")
        for key in keys:
            value = paddle.to_tensor(tensors[key])
            if tp.is_split(param) and list(value.shape) == tp.whole_shape(param):
                value = tp.local_slice(value, param)  # moments of a split weight
            elif list(value.shape) not in (list(param.shape), [1]):  # moments, or a beta power
                raise ValueError(f"{source}: {key} has shape {list(value.shape)}, the model's parameter "
                                 f"{list(param.shape)}")
            state[(sharding.state_name(param), key[len(prefix):])] = sharding.local_state(param, value)
    masters = {p: v for (p, k), v in state.items() if k == "master_weight"}
    flat = {f"{p}_{k}": v for (p, k), v in state.items() if k != "master_weight"}
    if masters:
        flat["master_weights"] = masters
    sharding.optimizer.set_state_dict(flat)
