"""AdamW state in a layout-free form, so a step checkpoint resumes under any process layout.

Every accumulator is stored whole, under the whole model's parameter name and Paddle's orientation:

    "<parameter>/<accumulator>"  e.g.  "model.layers.0.self_attn.q_proj.weight/moment1_0"   (shape of the weight)
                                       "model.layers.0.self_attn.q_proj.weight/beta1_pow_acc_0"   ([1])

Saving gathers tensor-parallel slices along their split axis, takes each pipeline stage's parameters under the
whole model's names and each sharding rank's own parameters; loading gives every rank the slice of the
parameters it holds, and under sharding only those its optimizer owns. So tp2 x pp2 x dp2 -> one process and one
process -> tp2 x sharding2 both continue where the checkpoint stopped.
"""
from __future__ import annotations

from typing import Dict

import numpy as np
import paddle

from alignment.parallel import tensor_parallel as tp
from alignment.parallel.distributed import gather_objects, hybrid_group, split_optimizer_states

SEPARATOR = "/"


def canonical_parameters(model) -> Dict[str, paddle.Tensor]:
    """{whole-model parameter name: this rank's parameter}: pipeline stages name theirs as the whole model does."""
    return model.hf_names() if hasattr(model, "hf_names") else dict(model.named_parameters())


def _owned(optimizer, param) -> bool:
    """Whether this rank's optimizer updates `param` (sharding stage 1 gives each parameter to one rank)."""
    owner = getattr(optimizer, "_param2rank", None)
    if owner is None:
        return True
    return owner[param.name] == hybrid_group().get_sharding_parallel_rank()


def _accumulators(optimizer, param) -> Dict[str, paddle.Tensor]:
    """{accumulator name as in state_dict keys (moment1_0, ...): tensor} of one parameter."""
    inner = getattr(optimizer, "_inner_opt", optimizer)
    out = {}
    for per_param in inner._accumulators.values():
        tensor = per_param.get(param.name)
        if tensor is not None:
            out[tensor.name[len(param.name) + 1:]] = tensor
    master = getattr(inner, "_master_weights", {}).get(param.name)
    if master is not None:
        out["master_weight"] = master
    return out


def whole_optimizer_state(model, optimizer) -> Dict[str, np.ndarray]:
    """The whole AdamW state of `model` as host arrays, on every rank (rank 0 writes it). A collective: every rank
    calls it."""
    local = {}
    for name, param in sorted(canonical_parameters(model).items()):
        if getattr(param, "tied_copy", False):
            continue  # a pipeline stage's second copy of a tied table: the first stage's state is the same
        accumulators = _accumulators(optimizer, param) if _owned(optimizer, param) else {}
        for key, tensor in sorted(accumulators.items()):
            if tp.is_split(param) and list(tensor.shape) == list(param.shape):
                tensor = tp.gather_along(tensor, param.split_axis)  # every rank of the tensor-parallel group
            local[f"{name}{SEPARATOR}{key}"] = tensor.numpy()
    if not split_optimizer_states():
        return local  # plain data parallelism: every rank holds the same whole state
    group = hybrid_group()
    contributes = group.get_data_parallel_rank() == 0 and group.get_model_parallel_rank() == 0
    merged = {}
    for part in gather_objects(local if contributes else {}):
        merged.update(part)
    return merged


def load_whole_optimizer_state(model, optimizer, tensors: Dict[str, np.ndarray], source: str) -> None:
    """Set this rank's share of a whole state into `optimizer` (before or after its first step)."""
    state = {}
    for name, param in canonical_parameters(model).items():
        if param.stop_gradient or not _owned(optimizer, param):
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
            state[(param, key[len(prefix):])] = value
    masters = {p.name: v for (p, k), v in state.items() if k == "master_weight"}
    flat = {f"{p.name}_{k}": v for (p, k), v in state.items() if k != "master_weight"}
    if masters:
        flat["master_weights"] = masters
    optimizer.set_state_dict(flat)
