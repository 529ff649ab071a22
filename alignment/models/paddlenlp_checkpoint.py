"""PaddleNLP-written LLaMA / Qwen2 checkpoints, read as our Hugging Face layout.

PaddleNLP's `save_pretrained` writes `config.json` plus the weights as `model_state.pdparams` (a pickle of numpy
arrays, read by pdparams.py's restricted unpickler, never `paddle.load`: a crafted file cannot run code),
`model_state-0000i-of-0000n.pdparams` + `model_state.pdparams.index.json`, or with
`safe_serialization=True` `model.safetensors` (+ index). Tensor names carry the base model's prefix
(`llama.layers.0.self_attn.q_proj.weight`, `qwen2.norm.weight`) and Linear weights are Paddle's [in, out], with
`lm_head.weight` [hidden, vocab]; `fuse_attention_qkv` / `fuse_attention_ffn` store `qkv_proj` (per kv head: its
query group, its key, its value) and `gate_up_fused_proj` (gate half, then up half).

PaddleFormers' ERNIE 4.5 (`model_type: ernie4_5`; the ERNIE-4.5-*-Paddle checkpoints, ERNIEKit) has its own
names (LAYOUTS): prefix `ernie.`, `qkv_proj` as [all query heads | all key heads | all value heads] and
`up_gate_proj` as [gate | up], both [in, out]; a tied `lm_head.weight` is the [vocab, hidden] embedding, an untied one
[hidden, vocab] (Baidu's ERNIE repository, tools/paddle2torch, converts them so); its config.json adds kernel switches
(`fuse_rope`, `use_flash_attention`, ...), dropped here, and `compression_ratio` / `use_rmsnorm`, which config.py
checks. PaddleFormers
1.x writes ERNIE 4.5 in transformers' names instead, read as an HF checkpoint.

`load_state_dict` returns {HF name: (tensor in HF's [out, in] layout, file)}, what checkpoint.load_hf_state_dict
returns for an HF checkpoint; `hf_config_dict` turns PaddleNLP's config.json keys into ours. Tested on checkpoints
PaddleNLP itself wrote (tests/fixtures/paddlenlp_checkpoints/, tools/make_paddlenlp_fixture.py) and, for ERNIE 4.5,
on transformers' fixture renamed to PaddleFormers' layout (tests/models/test_ernie4_5.py).
"""
from __future__ import annotations

import contextlib
import glob
import os
from typing import Callable, Dict, List, NamedTuple

import paddle
from safetensors import SafetensorError, safe_open

from alignment.inputs import read_json_object
from alignment.models.pdparams import read_state_dict
from alignment.models.weight_index import read_weight_map

PDPARAMS_NAME = "model_state.pdparams"
PDPARAMS_INDEX_NAME = "model_state.pdparams.index.json"
SAFE_NAME = "model.safetensors"
SAFE_INDEX_NAME = "model.safetensors.index.json"
BASE_PREFIXES = ("llama.", "qwen2.", "ernie.")  # PaddleNLP's / PaddleFormers' base_model_prefix of our model types
BARE_PREFIXES = ("embed_tokens.", "layers.", "norm.")  # a base model (LlamaModel) saved on its own
# PaddleNLP training / kernel switches: nothing to do with the weights, never written to our config.json
RUNTIME_KEYS = (
    "alibi", "context_parallel_degree", "dpo_config", "fuse_attention_ffn", "fuse_attention_qkv",
    "fuse_rope", "fuse_sequence_parallel_allreduce", "immediate_clear_past_key_value", "long_sequence_init_args",
    "long_sequence_strategy_name", "long_sequence_strategy_type", "no_recompute_layers", "paddlenlp_version",
    "pipeline_parallel_degree", "pp_recompute_interval", "recompute_granularity", "refined_recompute",
    "rope_scaling_factor", "rope_scaling_type", "sep_parallel_degree", "seq_length", "sequence_parallel",
    "tensor_parallel_output", "tensor_parallel_rank", "use_fused_rms_norm", "use_fused_rope",
    "use_flash_attention", "use_long_sequence_strategies", "use_recompute", "virtual_pp_degree",
    # PaddleFormers' ERNIE 4.5: those Baidu's paddle2torch drops but compression_ratio and use_rmsnorm (config.py
    # checks them)
    "add_tail_layers", "fuse_gate_detach_matmul", "fuse_linear", "fuse_ln", "fuse_rms_norm", "fuse_swiglu",
    "max_sequence_length", "model_name", "use_fast_ln",
)


class Layout(NamedTuple):
    """How a model type's fused projections are stored: names and the order of their parts."""
    qkv: str  # the fused q/k/v projection's name
    grouped_qkv: bool  # per kv head (its query group, its key, its value), else [all q | all k | all v]
    gate_up: str  # the fused gate/up projection's name ([gate | up])


PADDLENLP = Layout("qkv_proj", True, "gate_up_fused_proj")
LAYOUTS = {"ernie4_5": Layout("qkv_proj", False, "up_gate_proj")}  # model_type -> its layout; others PADDLENLP
FileReader = Callable[[str], Dict[str, paddle.Tensor]]


def is_paddlenlp_checkpoint(path: str) -> bool:
    """True for a directory PaddleNLP wrote: `.pdparams` weights, or safetensors under PaddleNLP's tensor names."""
    if not os.path.isdir(path):
        return False
    if os.path.exists(os.path.join(path, PDPARAMS_NAME)) or os.path.exists(os.path.join(path, PDPARAMS_INDEX_NAME)):
        return True
    if _split_files(path):
        return True
    return any(name.startswith(BASE_PREFIXES) for name in _safetensors_names(path))


def _split_files(path: str) -> List[str]:
    """Tensor- or pipeline-parallel slices (model_state.tp00.pdparams, ...), which we cannot read."""
    return sorted(glob.glob(os.path.join(path, "model_state.tp*.pdparams")) +
                  glob.glob(os.path.join(path, "model_state.pp*.pdparams")))


def _safetensors_names(path: str) -> List[str]:
    """Tensor names in the directory's safetensors index or single file (its header only); [] when neither."""
    index = os.path.join(path, SAFE_INDEX_NAME)
    if os.path.exists(index):
        try:
            return list(read_weight_map(index, ".safetensors"))
        except ValueError:
            return []  # left to the HF loader, which names the problem
    single = os.path.join(path, SAFE_NAME)
    if not os.path.exists(single):
        return []
    try:
        with safe_open(single, framework="numpy") as f:
            return list(f.keys())
    except (SafetensorError, OSError, ValueError):
        return []


def _weights_source(path: str) -> str:
    """The file the weights start from: an index, else a single file (`.pdparams` before safetensors)."""
    split = _split_files(path)
    if split and not os.path.exists(os.path.join(path, PDPARAMS_NAME)):
        raise ValueError(f"{split[0]}: a tensor/pipeline-parallel slice of a PaddleNLP checkpoint; save it whole "
                         "first (PaddleNLP save_pretrained with merge_tensor_parallel=True)")
    for name in (PDPARAMS_INDEX_NAME, PDPARAMS_NAME, SAFE_INDEX_NAME, SAFE_NAME):
        if os.path.exists(os.path.join(path, name)):
            return os.path.join(path, name)
    raise FileNotFoundError(f"{path}: no {PDPARAMS_NAME}, {PDPARAMS_INDEX_NAME}, {SAFE_NAME} or {SAFE_INDEX_NAME}")


def _weight_map(index_file: str) -> Dict[str, str]:
    """{tensor name: file name} of a weight index (only files beside it, of the index's kind)."""
    return read_weight_map(index_file, ".pdparams" if index_file.endswith(PDPARAMS_INDEX_NAME) else ".safetensors")


def weight_files(path: str) -> List[str]:
    """The checkpoint's weight files, `.pdparams` preferred when both forms are present."""
    source = _weights_source(path)
    if source.endswith(".index.json"):
        return [os.path.join(path, name) for name in sorted(set(_weight_map(source).values()))]
    return [source]


def stored_names(path: str) -> List[str]:
    """Tensor names as PaddleNLP stored them (a single `.pdparams` file is read whole: it is a pickle)."""
    source = _weights_source(path)
    if source.endswith(".index.json"):
        return list(_weight_map(source))
    return list(read_pdparams(source)) if source.endswith(".pdparams") else _safetensors_names(path)


def read_pdparams(file: str) -> Dict[str, paddle.Tensor]:
    """The tensors of one `.pdparams` file (uint16 arrays are Paddle's bfloat16 and become bfloat16 tensors, as
    paddle.load makes them)."""
    return {name: paddle.to_tensor(array) for name, array in read_state_dict(file).items()}


def hf_name(name: str) -> str:
    """PaddleNLP tensor name -> ours (HF's): `llama.` / `qwen2.` -> `model.`; `lm_head.weight` unchanged."""
    for prefix in BASE_PREFIXES:
        if name.startswith(prefix):
            return "model." + name[len(prefix):]
    return "model." + name if name.startswith(BARE_PREFIXES) else name


def _split_qkv(tensor: paddle.Tensor, config: dict, file: str, name: str, grouped: bool) -> List[paddle.Tensor]:
    """A fused qkv_proj weight [hidden, kv * (groups + 2) * d] (or bias [kv * (groups + 2) * d]) -> q, k, v in the
    same orientation. grouped (PaddleNLP): per kv head its `groups` query heads, then its key, then its value; else
    all query heads, then all keys, then all values."""
    heads, kv = config["num_attention_heads"], config.get("num_key_value_heads") or config["num_attention_heads"]
    d = config.get("head_dim") or config["hidden_size"] // heads
    groups = heads // kv
    lead = list(tensor.shape[:-1])
    if tensor.shape[-1] != kv * (groups + 2) * d:
        raise ValueError(f"{file}: tensor {name} has shape {list(tensor.shape)}, the config expects last dimension "
                         f"{kv * (groups + 2) * d} ({heads} heads, {kv} key/value heads, head_dim {d})")
    if not grouped:
        return paddle.split(tensor, [heads * d, kv * d, kv * d], axis=-1)
    parts = tensor.reshape(lead + [kv, groups + 2, d])
    q, k, v = paddle.split(parts, [groups, 1, 1], axis=-2)
    return [p.reshape(lead + [-1]) for p in (q, k, v)]


def _hf_tensors(name: str, tensor: paddle.Tensor, config: dict, file: str) -> Dict[str, paddle.Tensor]:
    """One PaddleNLP tensor -> {HF name: tensor in HF orientation} (fused projections give several)."""
    target, layout = hf_name(name), LAYOUTS.get(config.get("model_type"), PADDLENLP)
    if f".self_attn.{layout.qkv}." in target:
        q, k, v = _split_qkv(tensor, config, file, name, layout.grouped_qkv)
        return {target.replace(layout.qkv, proj): _hf_orientation(t) for proj, t in zip(("q_proj", "k_proj",
                                                                                        "v_proj"), (q, k, v))}
    if f".mlp.{layout.gate_up}." in target:
        if tensor.shape[-1] % 2:
            raise ValueError(f"{file}: tensor {name} has shape {list(tensor.shape)}, an odd fused gate/up width")
        gate, up = paddle.chunk(tensor, 2, axis=-1)
        return {target.replace(layout.gate_up, "gate_proj"): _hf_orientation(gate),
                target.replace(layout.gate_up, "up_proj"): _hf_orientation(up)}
    if target.endswith("embed_tokens.weight"):
        return {target: tensor}
    return {target: _hf_orientation(tensor)}


def _hf_orientation(tensor: paddle.Tensor) -> paddle.Tensor:
    """Paddle's Linear weight [in, out] -> HF's [out, in]; vectors (biases, norms) unchanged."""
    return tensor.T.contiguous() if tensor.ndim == 2 else tensor


def _raw_config(path: str) -> dict:
    return read_json_object(os.path.join(path, "config.json"), "PaddleNLP model config")


def load_state_dict(path: str, read_safetensors: FileReader) -> Dict[str, tuple]:
    """{HF name: (tensor in HF layout, file)} for a PaddleNLP checkpoint directory. `read_safetensors(file)` reads
    one safetensors file ({name: tensor}, naming the file on error), as the HF loader does."""
    config = _raw_config(path)
    tensors = {}
    for file in weight_files(path):
        if not os.path.exists(file):
            raise FileNotFoundError(f"{file}: listed in the PaddleNLP weight index but missing")
        stored = read_pdparams(file) if file.endswith(".pdparams") else read_safetensors(file)
        for name, tensor in stored.items():
            for target, value in _hf_tensors(name, tensor, config, file).items():
                tensors[target] = (value, file)
    return tensors


def _stored(path: str, names: List[str], values: bool) -> Dict[str, object]:
    """{name: shape (a list)} of the stored tensors `names`, or with `values` {name: numpy array} (its shape where
    numpy cannot hold the dtype, bfloat16), reading only the files that hold them (a `.pdparams` file whole)."""
    source = _weights_source(path)
    if source.endswith(".index.json"):
        weight_map = _weight_map(source)
        files = sorted({os.path.join(path, weight_map[n]) for n in names if n in weight_map})
    else:
        files = [source]
    out = {}
    for file in files:
        if file.endswith(".pdparams"):
            state = read_pdparams(file)
            out.update({n: state[n].astype("float32").numpy() if values else list(state[n].shape)
                        for n in names if n in state})
            continue
        try:
            with safe_open(file, framework="numpy") as f:
                for name in set(names) & set(f.keys()):
                    out[name] = f.get_slice(name).get_shape()
                    if values:
                        with contextlib.suppress(TypeError, ValueError):  # numpy has no bfloat16
                            out[name] = f.get_tensor(name)
        except (SafetensorError, OSError) as err:
            raise ValueError(f"{file}: cannot read safetensors file, truncated or corrupt? ({err})") from err
    return out


def separate_lm_head(path: str) -> bool:
    """Whether the stored `lm_head.weight` is a head of its own even though config.json says the embeddings are
    tied: PaddleNLP 2.8's LlamaForCausalLM ignores `tie_word_embeddings` and saves its own [hidden, vocab] head,
    whereas PaddleNLP 3 ties and saves the shared [vocab, hidden] embedding under the head's name as well."""
    names = [n for n in stored_names(path) if n == "lm_head.weight" or n.endswith("embed_tokens.weight")]
    if "lm_head.weight" not in names or len(names) != 2:
        return False
    shapes = _stored(path, names, values=False)
    head, embed = shapes.pop("lm_head.weight"), shapes.popitem()[1]
    if head != embed:
        return head == embed[::-1]  # Paddle's Linear layout [hidden, vocab]: a head of its own
    arrays = _stored(path, names, values=True)  # square (vocab == hidden): the values tell
    head, embed = arrays.pop("lm_head.weight"), arrays.popitem()[1]
    if isinstance(head, list) or isinstance(embed, list):
        return False  # unreadable by numpy: take the config's word
    return not (head == embed).all()  # the same values: the shared embedding


def hf_config_dict(data: dict, path: str) -> dict:
    """PaddleNLP's config.json keys -> ours: PaddleNLP-only switches dropped, features we lack refused."""
    if not isinstance(data, dict):
        return data
    if data.get("alibi"):
        raise ValueError("ALiBi position biases (alibi=true) are not supported")
    if data.get("use_long_sequence_strategies"):
        raise ValueError("PaddleNLP long-sequence strategies (use_long_sequence_strategies=true) are not supported")
    scaling, factor = data.get("rope_scaling_type"), data.get("rope_scaling_factor", 1.0)
    if scaling and factor not in (None, 1, 1.0):
        raise ValueError(f"rope scaling {scaling!r} (rope_scaling_factor {factor}) is not supported yet "
                         "(only default RoPE)")
    out = {k: v for k, v in data.items()
           if k not in RUNTIME_KEYS and k not in ("tensor_parallel_degree", "expert_parallel_degree")}
    dtype = out.pop("dtype", None)
    if dtype and "torch_dtype" not in out:
        out["torch_dtype"] = dtype
    if out.get("tie_word_embeddings") and separate_lm_head(path):
        out["tie_word_embeddings"] = False
    return out
