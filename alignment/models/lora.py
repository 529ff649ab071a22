"""LoRA adapters on the projection layers, saved in Hugging Face PEFT's layout.

    y = x W + b + dropout(x) A B * (alpha / r)       W [in, out] frozen; A [in, r], B [r, out] trained (B starts at 0)

rsLoRA scales by alpha / sqrt(r) instead (PEFT's use_rslora, recorded in adapter_config.json so merging and loading
give the same model). LoRA+ gives each B a learning-rate multiplier (ParamAttr learning_rate = plus_scale, as
PaddleNLP's LoRALinear does): AdamW steps B with plus_scale x the scheduled learning rate.

`apply_lora` swaps each targeted `nn.Linear` for a `LoRALinear` that keeps the same `weight` / `bias` parameters
(same names, so checkpoints of the base load unchanged) and adds `lora_A` / `lora_B`; every other parameter is
frozen except the modules named in `trainable` (a score model's head). `adapters_disabled(model)` switches the
adapters off, which gives the base model back without a second copy (PPO's reference).

PEFT layout (what `peft` writes for LoraConfig on a transformers model, `adapter_name` "default"):
    adapter_config.json          peft_type "LORA", r, lora_alpha, lora_dropout, target_modules, task_type, ...
    adapter_model.safetensors    base_model.model.<module>.lora_A.weight [r, in]
                                 base_model.model.<module>.lora_B.weight [out, r]
                                 base_model.model.<head>.weight          (modules_to_save, e.g. score)
"""
from __future__ import annotations

import contextlib
import json
import math
import os
import re
from typing import Dict, Iterable, List, Optional, Sequence

import paddle
import paddle.nn as nn
import paddle.nn.functional as F
from safetensors import SafetensorError
from safetensors.numpy import load_file
from safetensors.paddle import save_file

from alignment.fileio import atomic_directory
from alignment.inputs import FINITE, FLAG, POSITIVE_INT, TEXT, Kind, check_keys, either, list_of, read_json
from alignment.models.tokenizer import copy_tokenizer_files

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
DEFAULT_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
PEFT_PREFIX = "base_model.model."


def adapter_scaling(alpha: float, rank: int, rslora: bool = False) -> float:
    """The factor on x A B: alpha / r, or alpha / sqrt(r) with rsLoRA."""
    return alpha / math.sqrt(rank) if rslora else alpha / rank


class LoRALinear(nn.Layer):
    def __init__(self, base: nn.Linear, rank: int, alpha: float, dropout: float, rslora: bool = False,
                 plus_scale: float = 1.0):
        super().__init__()
        in_features, out_features = base.weight.shape
        self.weight, self.bias = base.weight, base.bias  # the base parameters, under their original names
        self.weight.stop_gradient = True
        if self.bias is not None:
            self.bias.stop_gradient = True
        bound = 1.0 / math.sqrt(in_features)  # PEFT: kaiming_uniform(a=sqrt(5)) on A, zeros on B
        self.lora_A = self.create_parameter([in_features, rank], default_initializer=nn.initializer.Uniform(
            -bound, bound))
        self.lora_B = self.create_parameter([rank, out_features], attr=paddle.ParamAttr(learning_rate=plus_scale),
                                            default_initializer=nn.initializer.Constant(0.0))
        self.rank, self.alpha, self.scaling = rank, alpha, adapter_scaling(alpha, rank, rslora)
        self.dropout = nn.Dropout(dropout) if dropout > 0 else None
        self.enabled = True

    def forward(self, x):
        out = F.linear(x, self.weight, self.bias)
        if not self.enabled:
            return out
        h = self.dropout(x) if self.dropout is not None else x
        return out + paddle.matmul(paddle.matmul(h, self.lora_A), self.lora_B) * self.scaling

    def merged_weight(self) -> paddle.Tensor:
        """W + A B * scaling, [in, out]."""
        return self.weight + paddle.matmul(self.lora_A, self.lora_B) * self.scaling


def _matches(name: str, targets: Sequence[str]) -> bool:
    """PEFT's rule: a plain name matches the last component(s) of the module path; a pattern with regex
    characters must match the whole path."""
    for target in targets:
        if any(c in target for c in "^$*+?[](){}|\\"):
            if re.fullmatch(target, name):
                return True
        elif name == target or name.endswith("." + target):
            return True
    return False


def set_sublayer(model: nn.Layer, name: str, layer: nn.Layer) -> None:
    """Put `layer` at the dotted path `name` of `model` in place of what is there."""
    parent = model
    *path, leaf = name.split(".")
    for part in path:
        parent = getattr(parent, part)
    setattr(parent, leaf, layer)


def apply_lora(model: nn.Layer, rank: int = 8, alpha: float = 16.0, dropout: float = 0.0,
               target_modules: Sequence[str] = DEFAULT_TARGETS, trainable: Iterable[str] = (), rslora: bool = False,
               plus_scale: float = 1.0) -> List[str]:
    """Wrap the targeted Linear layers in place, freeze the rest except `trainable` prefixes; return the wrapped
    layer names. Raises when nothing matches. `rslora`: scale by alpha / sqrt(rank); `plus_scale`: LoRA+'s
    learning-rate multiplier of every B."""
    if getattr(getattr(model, "config", None), "tensor_parallel_degree", 1) > 1:
        raise ValueError("LoRA with tensor_parallel_degree > 1 is not supported: set 'lora' false or the degree to 1")
    if getattr(getattr(model, "config", None), "expert_parallel_degree", 1) > 1:
        raise ValueError("LoRA with expert_parallel_degree > 1 is not supported: set 'lora' false or the degree to 1")
    wrapped = []
    for name, layer in list(model.named_sublayers()):
        if isinstance(layer, nn.Linear) and _matches(name, target_modules):
            set_sublayer(model, name, LoRALinear(layer, rank, alpha, dropout, rslora, plus_scale))
            wrapped.append(name)
    if not wrapped:
        raise ValueError(f"key 'lora_target_modules': {list(target_modules)} matches no Linear layer of the model")
    keep = tuple(trainable)
    for name, param in model.named_parameters():
        param.stop_gradient = not (".lora_A" in name or ".lora_B" in name or (bool(keep) and name.startswith(keep)))
    model.lora_config = {"r": rank, "lora_alpha": alpha, "lora_dropout": dropout, "use_rslora": bool(rslora),
                         "target_modules": sorted({n.split(".")[-1] for n in wrapped}),
                         "modules_to_save": [p.rstrip(".") for p in keep] or None}
    return wrapped


def lora_layers(model: nn.Layer) -> Dict[str, LoRALinear]:
    return {name: layer for name, layer in model.named_sublayers() if isinstance(layer, LoRALinear)}


def has_lora(model: nn.Layer) -> bool:
    return bool(lora_layers(model))


@contextlib.contextmanager
def adapters_disabled(model: nn.Layer):
    """Run the base model: every adapter off inside the block."""
    layers = list(lora_layers(model).values())
    for layer in layers:
        layer.enabled = False
    try:
        yield model
    finally:
        for layer in layers:
            layer.enabled = True


def peft_state_dict(model: nn.Layer) -> Dict[str, paddle.Tensor]:
    """Adapter (and modules_to_save) tensors under PEFT's names and orientation."""
    out = {}
    for name, layer in lora_layers(model).items():
        out[f"{PEFT_PREFIX}{name}.lora_A.weight"] = layer.lora_A.t().contiguous()  # [r, in]
        out[f"{PEFT_PREFIX}{name}.lora_B.weight"] = layer.lora_B.t().contiguous()  # [out, r]
    for module in model.lora_config.get("modules_to_save") or []:
        for name, param in getattr(model, module).named_parameters():
            value = param.t() if name == "weight" and param.ndim == 2 else param  # Linear: Paddle [in, out]
            out[f"{PEFT_PREFIX}{module}.{name}"] = value.contiguous()
    return out


def save_adapter(model: nn.Layer, path: str, base_model_name_or_path: Optional[str], task_type: str,
                 tokenizer_dir: Optional[str] = None, extra_files=None) -> None:
    """Write adapter_config.json + adapter_model.safetensors (+ tokenizer files, + what `extra_files(dir)` writes)
    atomically to `path`."""
    config = {"peft_type": "LORA", "task_type": task_type, "base_model_name_or_path": base_model_name_or_path,
              "inference_mode": True, "bias": "none", "fan_in_fan_out": False, "init_lora_weights": True,
              "use_rslora": False, "use_dora": False, "layers_to_transform": None, "layers_pattern": None,
              "rank_pattern": {}, "alpha_pattern": {}, "revision": None, **model.lora_config}
    with atomic_directory(path) as tmp:
        save_file(peft_state_dict(model), os.path.join(tmp, ADAPTER_WEIGHTS), metadata={"format": "pt"})
        with open(os.path.join(tmp, ADAPTER_CONFIG), "w", encoding="utf-8") as f:
            json.dump(config, f, indent=2, sort_keys=True)
        if tokenizer_dir:
            copy_tokenizer_files(tokenizer_dir, tmp)
        if extra_files is not None:
            extra_files(tmp)


ADAPTER_KEYS = {"peft_type": Kind("\"LORA\"", lambda v: v == "LORA"), "r": POSITIVE_INT, "lora_alpha": FINITE,
                "target_modules": either(TEXT, list_of(TEXT, non_empty=True)), "use_rslora": FLAG, "task_type": TEXT,
                "modules_to_save": list_of(TEXT), "base_model_name_or_path": TEXT}


def read_adapter_config(path: str) -> dict:
    """adapter_config.json of an adapter directory, every key this toolkit reads checked (PEFT's other keys are
    kept as written)."""
    file = os.path.join(path, ADAPTER_CONFIG)
    if not os.path.exists(file):
        raise FileNotFoundError(f"{path}: no {ADAPTER_CONFIG} (not a LoRA adapter directory)")
    config = check_keys(read_json(file, "adapter config"), ADAPTER_KEYS, file,
                        required=("peft_type", "r", "lora_alpha", "target_modules"), what="adapter config")
    if isinstance(config["target_modules"], str):  # PEFT's one pattern, matched against the whole module path
        config["target_modules"] = [config["target_modules"]]
    return config


def read_adapter_weights(file: str) -> dict:
    try:
        return load_file(file)
    except (SafetensorError, OSError) as err:
        raise ValueError(f"{file}: cannot read the adapter weights, truncated or corrupt? ({err})") from None


def other_base(path: str, config: dict, model, key: str, shape: list, needed: list) -> str:
    """The message for an adapter tensor whose shape does not fit: the adapter was trained on another base."""
    cfg = getattr(model, "config", None)
    sizes = (f"hidden_size {cfg.hidden_size}, intermediate_size {cfg.intermediate_size}" if cfg is not None
             else "another shape")
    return (f"{path}: the adapter was trained for another base model ({config.get('base_model_name_or_path')!r}, "
            f"its base_model_name_or_path) than this one ({sizes}): {key} has shape {shape}, this model needs "
            f"{needed}; load it onto the base it was trained on")


def check_scaling(config: dict, layers: Dict[str, LoRALinear], path: str) -> None:
    """The adapter's recorded r / lora_alpha / use_rslora must give the scaling the model's layers have."""
    saved = adapter_scaling(float(config["lora_alpha"]), config["r"], bool(config.get("use_rslora", False)))
    for layer in layers.values():
        if not math.isclose(layer.scaling, saved, rel_tol=1e-6):
            raise ValueError(f"{path}: the adapter was trained with scaling {saved:g} (r {config.get('r')}, "
                             f"lora_alpha {config.get('lora_alpha')}, use_rslora {config.get('use_rslora', False)}), "
                             f"this run's is {layer.scaling:g}; set keys 'lora_alpha' / 'rslora' to match")


def load_adapter(model: nn.Layer, path: str) -> None:
    """Copy saved adapter (and modules_to_save) weights into a model that `apply_lora` prepared the same way (same
    scaling: r, lora_alpha and use_rslora are checked)."""
    config = read_adapter_config(path)
    check_scaling(config, lora_layers(model), path)
    tensors = read_adapter_weights(os.path.join(path, ADAPTER_WEIGHTS))
    expected = peft_state_dict(model)
    missing, unexpected = sorted(set(expected) - set(tensors)), sorted(set(tensors) - set(expected))
    if missing or unexpected:
        raise ValueError(f"{path}: adapter does not fit the model (missing {missing[:3]}, unexpected "
                         f"{unexpected[:3]}); check lora_target_modules and lora_rank")
    layers = lora_layers(model)
    for key, value in tensors.items():
        if tuple(value.shape) != tuple(expected[key].shape):
            raise ValueError(other_base(path, config, model, key, list(value.shape), list(expected[key].shape)))
        name = key[len(PEFT_PREFIX):].rpartition(".")[0]  # drop the trailing ".weight"
        if name.endswith((".lora_A", ".lora_B")):
            layer_name, part = name.rsplit(".", 1)
            getattr(layers[layer_name], part).set_value(paddle.to_tensor(value.T))
        else:
            module, _, param_name = key[len(PEFT_PREFIX):].partition(".")
            param = dict(getattr(model, module).named_parameters())[param_name]
            param.set_value(paddle.to_tensor(value.T if param_name == "weight" and value.ndim == 2 else value))


def merge_lora(model: nn.Layer) -> None:
    """Fold every adapter into its base weight and put plain Linear layers back (for a full HF checkpoint)."""
    for name, layer in lora_layers(model).items():
        in_features, out_features = layer.weight.shape
        plain = nn.Linear(in_features, out_features, bias_attr=False if layer.bias is None else None)
        plain.weight.set_value(layer.merged_weight())
        if layer.bias is not None:
            plain.bias.set_value(layer.bias)
        set_sublayer(model, name, plain)
    model.lora_config = None


def add_lora(model: nn.Layer, lora_args, trainable: Iterable[str] = (), adapter_path: Optional[str] = None):
    """Adapters with the rank / alpha / rsLoRA / LoRA+ / dropout / targets of `lora_args` (config.LoRAArguments) on
    `model`, loaded from `adapter_path` when given; returns the model."""
    alpha, rslora, plus_scale = lora_args.scaling()
    apply_lora(model, lora_args.lora_rank, alpha, lora_args.lora_dropout, lora_args.lora_target_modules, trainable,
               rslora, plus_scale)
    if adapter_path:
        load_adapter(model, adapter_path)
    return model


def with_lora(model: nn.Layer, lora_args, trainable: Iterable[str] = ()):
    """`model` with adapters when `lora_args.lora` is on (from `lora_path` when given), else unchanged."""
    return add_lora(model, lora_args, trainable, lora_args.lora_path) if lora_args.lora else model
