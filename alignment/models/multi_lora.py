"""Several LoRA adapters on one base model, chosen row by row: one copy of the base serves them all.

    y_r = x_r W + b + (x_r A_i B_i) * scale_i      i = the adapter of batch row r (none: the base, y_r = x_r W + b)

`load_adapters(model, {name: directory})` reads adapters in PEFT's layout (lora.py's) and swaps every Linear some
adapter targets for a `MultiLoRALinear` holding each adapter's A [in, r] and B [r, out]; an adapter that does not
target a layer leaves its rows at the base there. A forward's rows are routed by
`with routed(model, [i_0, i_1, ...]):` (one adapter index or None per batch row); outside such a block every row
is the base.

The same bits as one adapter alone: for each adapter present in the batch the delta is computed over the whole
batch, `out + (x A) B * scale` on the [b, s, in] input a model with that adapter alone (LoRALinear) computes, and
that adapter's rows take it through `where`, which copies values. Gathering an adapter's rows into a smaller batch
would be cheaper but changes the GEMM shapes, and MKL rounds a one-row product differently from the same row in
a batch (measured here: 7.6e-6 apart on a [1, 64] x [64, 8] x [8, 192] product, the same bits from two rows on),
so an answer would depend on how many rows of its adapter shared the step. The price is one small LoRA product
per adapter present, over the whole batch.
"""
from __future__ import annotations

import contextlib
import os
from typing import Dict, List, Optional, Sequence, Tuple

import paddle
import paddle.nn as nn
import paddle.nn.functional as F

from alignment.models.lora import (ADAPTER_WEIGHTS, PEFT_PREFIX, adapter_scaling, other_base, read_adapter_config,
                                   read_adapter_weights, set_sublayer)

LORA_PARTS = (".lora_A.weight", ".lora_B.weight")


class AdapterError(ValueError):
    """An adapter directory that cannot be served on the base: `name` and `path` say which."""

    def __init__(self, name: str, path: str, message: str):
        super().__init__(message)
        self.name, self.path = name, path


class AdapterRouting:
    """The served adapters' names (index i is names[i]) and the adapter of each row of the forward running now."""

    def __init__(self, names: List[str]):
        self.names = list(names)
        self.masks: Optional[Dict[int, paddle.Tensor]] = None  # adapter -> [b] bool, its rows; None: all base
        self.whole: Optional[int] = None  # the adapter every row runs, if one does
        self.batch = 0

    def index(self, name: str) -> int:
        return self.names.index(name)

    @contextlib.contextmanager
    def rows(self, adapters: Sequence[Optional[int]]):
        """Route a forward's rows: adapters[r] is row r's adapter index, None for the base."""
        present = sorted({a for a in adapters if a is not None})
        self.batch = len(adapters)
        self.masks = {i: paddle.to_tensor([a == i for a in adapters]) for i in present} if present else None
        self.whole = present[0] if len(present) == 1 and all(a == present[0] for a in adapters) else None
        try:
            yield
        finally:
            self.masks, self.whole = None, None


class MultiLoRALinear(nn.Layer):
    """A Linear with several adapters; each row of a forward takes its own (AdapterRouting.rows)."""

    def __init__(self, base: nn.Linear, routing: AdapterRouting):
        super().__init__()
        self.weight, self.bias = base.weight, base.bias
        self.routing = routing
        self.adapters: Dict[int, Tuple[paddle.Tensor, paddle.Tensor, float]] = {}  # index -> (A, B, scale)

    def forward(self, x):
        out = F.linear(x, self.weight, self.bias)
        masks = self.routing.masks
        if masks is None:
            return out
        if x.shape[0] != self.routing.batch:
            raise ValueError(f"MultiLoRALinear: {self.routing.batch} rows routed, the batch has {x.shape[0]}")
        result = out
        for index, mask in masks.items():
            if index not in self.adapters:
                continue
            lora_a, lora_b, scale = self.adapters[index]
            adapted = out + paddle.matmul(paddle.matmul(x, lora_a), lora_b) * scale  # as LoRALinear computes it
            if index == self.routing.whole:  # every row runs this adapter
                return adapted
            rows = mask.reshape([-1] + [1] * (x.ndim - 1)).expand(out.shape)
            result = paddle.where(rows, adapted, result)
        return result


def adapter_routing(model) -> Optional[AdapterRouting]:
    """The model's served adapters (load_adapters), or None."""
    return getattr(model, "adapter_routing", None)


def routed(model, adapters: Sequence[Optional[int]]):
    """A block in which row r of the model's forward runs adapter adapters[r] (a no-op without served adapters)."""
    routing = adapter_routing(model)
    return routing.rows(adapters) if routing is not None else contextlib.nullcontext()


def _adapter_tensors(path: str, config: dict, model, linears: Dict[str, nn.Layer]):
    """{layer name: (A [in, r], B [r, out])} of the adapter at `path`, checked against the base's Linear layers."""
    tensors = read_adapter_weights(os.path.join(path, ADAPTER_WEIGHTS))
    pairs: Dict[str, dict] = {}
    for key, value in tensors.items():
        part = next((p for p in LORA_PARTS if key.startswith(PEFT_PREFIX) and key.endswith(p)), None)
        if part is None:
            raise ValueError(f"{path}: {key} is not a LoRA A or B tensor (modules_to_save and other tensors are "
                             f"not served per adapter; merge it with tools/merge_lora.py and serve the result)")
        pairs.setdefault(key[len(PEFT_PREFIX):-len(part)], {})[part] = value
    if not pairs:
        raise ValueError(f"{path}: {ADAPTER_WEIGHTS} holds no LoRA tensors")
    out = {}
    for name, parts in sorted(pairs.items()):
        layer = linears.get(name)
        if layer is None:
            raise ValueError(f"{path}: the adapter targets {name}, which is not a Linear layer of this base model "
                             f"(the adapter's base_model_name_or_path: {config.get('base_model_name_or_path')!r})")
        if len(parts) != 2:
            raise ValueError(f"{path}: {name} has only {list(parts)[0].split('.')[1]}, not both lora_A and lora_B")
        in_features, out_features = layer.weight.shape
        rank = config["r"]
        for part, needed in zip(LORA_PARTS, ([rank, in_features], [out_features, rank])):
            if list(parts[part].shape) != needed:
                raise ValueError(other_base(path, config, model, PEFT_PREFIX + name + part,
                                            list(parts[part].shape), needed))
        dtype = layer.weight.dtype
        out[name] = tuple(paddle.to_tensor(parts[p].T).astype(dtype) for p in LORA_PARTS)
    return out


def load_adapters(model: nn.Layer, adapters: Dict[str, str]) -> AdapterRouting:
    """Serve the adapters {name: directory} on `model` (index i: the i-th name); -> the model's routing. Raises
    AdapterError for an adapter that does not fit the base, before the model is changed."""
    routing = AdapterRouting(list(adapters))
    linears = {name: layer for name, layer in model.named_sublayers()
               if isinstance(layer, (nn.Linear, MultiLoRALinear))}
    loaded = []
    for name, path in adapters.items():
        try:
            config = read_adapter_config(path)
            scale = adapter_scaling(float(config["lora_alpha"]), config["r"], bool(config.get("use_rslora", False)))
            loaded.append((_adapter_tensors(path, config, model, linears), scale))
        except (ValueError, FileNotFoundError) as err:
            raise AdapterError(name, path, str(err)) from None
    for index, (tensors, scale) in enumerate(loaded):
        for name, (lora_a, lora_b) in tensors.items():
            layer = linears[name]
            if not isinstance(layer, MultiLoRALinear):
                layer = linears[name] = MultiLoRALinear(layer, routing)
                set_sublayer(model, name, layer)
            layer.adapters[index] = (lora_a, lora_b, scale)
    model.adapter_routing = routing
    return routing
