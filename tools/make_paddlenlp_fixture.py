"""Make tests/fixtures/paddlenlp_checkpoints/: tiny checkpoints written by PaddleNLP itself, and their logits.

Run inside a separate virtualenv that has PaddleNLP (never the project's own environment), from the repository root:

    # LLaMA, PaddleNLP 2.8.1 on paddlepaddle 2.6.2 (Python 3.11):
    python -m venv /work/venvs/paddlenlp
    /work/venvs/paddlenlp/bin/pip install paddlepaddle==2.6.2 paddlenlp==2.8.1 "numpy<2" "datasets<3" \
        "huggingface_hub<0.26" "aistudio-sdk==0.2.6" "scipy<1.14" "pyarrow<17"
    OMP_NUM_THREADS=1 /work/venvs/paddlenlp/bin/python tools/make_paddlenlp_fixture.py

    # Qwen2 (PaddleNLP 2.8.1 has none) and PaddleNLP 3's tied LLaMA: PaddleNLP 3.0.0b4 on paddlepaddle 3.0.0:
    python -m venv /work/venvs/paddlenlp3
    /work/venvs/paddlenlp3/bin/pip install paddlepaddle==3.0.0 paddlenlp==3.0.0b4 "numpy<2" "datasets<3" \
        "huggingface_hub<0.26" "aistudio-sdk==0.2.6" "scipy<1.14" "pyarrow<17"
    OMP_NUM_THREADS=1 /work/venvs/paddlenlp3/bin/python tools/make_paddlenlp_fixture.py

Each variant is one directory written by PaddleNLP's own `save_pretrained` (config.json, generation_config.json and
the weights under PaddleNLP's names and [in, out] Linear layout); `expected.json` maps each variant to the input ids,
PaddleNLP's logits for them, and the versions that made it (a later run for other models keeps earlier entries).
Weights are redrawn after construction (seeded; Linear/Embedding ~ N(0, 0.2), biases ~ N(0, 0.1), norms ~
1 + N(0, 0.1)) so the logits are far from uniform.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import sys

if importlib.util.find_spec("paddlenlp") is None:  # a maintainer's script, for its own environment
    sys.exit("error: paddlenlp is not installed: this script runs in a PaddleNLP environment (see its docstring)")

try:  # paddle 2.6.2's bundled libraries break some C extensions imported after it (scipy, aiohttp: zlib.error)
    import datasets  # noqa: F401
    import scipy.linalg  # noqa: F401
except ImportError:
    pass

import numpy as np
import paddle
import paddlenlp

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(REPO, "tests", "fixtures", "paddlenlp_checkpoints")
SIZES = dict(vocab_size=64, hidden_size=32, intermediate_size=32, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=64)
# variant -> (PaddleNLP major version that writes it, model, extra config keys, save_pretrained keyword arguments)
VARIANTS = {
    "llama_pdparams": ("2", "llama", {}, {}),
    "llama_safetensors": ("2", "llama", {}, {"safe_serialization": True}),
    # PaddleNLP 2.8 ignores tie_word_embeddings for LLaMA: a separate [hidden, vocab] head, saved as lm_head.weight
    "llama_fused_tied_sharded_safetensors": (
        "2", "llama", {"fuse_attention_qkv": True, "fuse_attention_ffn": True, "tie_word_embeddings": True},
        {"safe_serialization": True, "max_shard_size": "20KB"}),
    # PaddleNLP 3 ties, and saves the shared [vocab, hidden] embedding under lm_head.weight as well
    "llama_tied_pdparams_v3": ("3", "llama", {"tie_word_embeddings": True}, {}),
    "qwen2_tied_safetensors_v3": ("3", "qwen2", {"tie_word_embeddings": True, "rope_theta": 1000000.0},
                                  {"safe_serialization": True}),
    "qwen2_fused_sharded_v3": ("3", "qwen2", {"fuse_attention_qkv": True, "fuse_attention_ffn": True},
                               {"max_shard_size": "20KB"}),
}


def build(model: str, extra: dict, seed: int):
    """A PaddleNLP causal LM of the tiny sizes with seeded, larger-than-default random weights."""
    if model == "llama":
        from paddlenlp.transformers import LlamaConfig as Config, LlamaForCausalLM as Model
    else:
        from paddlenlp.transformers import Qwen2Config as Config, Qwen2ForCausalLM as Model
    paddle.seed(seed)
    net = Model(Config(**SIZES, **extra))
    rng = np.random.RandomState(seed)
    for name, param in net.named_parameters():  # shared (tied) parameters are listed once
        if "norm" in name:
            value = 1.0 + rng.normal(0.0, 0.1, param.shape)
        elif name.endswith("bias"):
            value = rng.normal(0.0, 0.1, param.shape)
        else:
            value = rng.normal(0.0, 0.2, param.shape)
        param.set_value(paddle.to_tensor(value.astype("float32")))
    net.eval()
    return net


def logits_of(net, input_ids: np.ndarray) -> np.ndarray:
    """PaddleNLP's own forward pass, full attention, no padding."""
    with paddle.no_grad():
        out = net(paddle.to_tensor(input_ids), return_dict=True)
    return out.logits.astype("float32").numpy()


def make(variant: str, seed: int) -> dict:
    """Write one variant's directory; its expected.json entry."""
    _, model, extra, save_kwargs = VARIANTS[variant]
    net = build(model, extra, seed)
    input_ids = np.random.RandomState(seed + 1).randint(0, SIZES["vocab_size"], size=[2, 6]).astype("int64")
    logits = logits_of(net, input_ids)
    path = os.path.join(OUT, variant)
    shutil.rmtree(path, ignore_errors=True)
    net.save_pretrained(path, **save_kwargs)
    for name in os.listdir(path):  # safetensors writes 0600 files
        os.chmod(os.path.join(path, name), 0o644)
    return {"model_class": type(net).__name__, "config": dict(SIZES, **extra), "save_pretrained": save_kwargs,
            "seed": seed, "paddlenlp": paddlenlp.__version__, "paddle": paddle.__version__,
            "input_ids": input_ids.tolist(), "logits": np.round(logits.astype("float64"), 7).tolist()}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--variants", nargs="+", choices=sorted(VARIANTS),
                        help="default: every variant the installed PaddleNLP major version writes")
    args = parser.parse_args(argv)
    paddle.set_device("cpu")
    paddle.set_default_dtype("float32")
    major = paddlenlp.__version__.split(".")[0]
    variants = args.variants or [name for name, spec in VARIANTS.items() if spec[0] == major]
    expected_file = os.path.join(OUT, "expected.json")
    expected = json.load(open(expected_file)) if os.path.exists(expected_file) else {}
    for i, variant in enumerate(VARIANTS):
        if variant in variants:
            expected[variant] = make(variant, seed=100 + i)
            print(f"{variant}: written by paddlenlp {paddlenlp.__version__}, paddle {paddle.__version__}")
    with open(expected_file, "w", encoding="utf-8") as f:
        json.dump(expected, f, sort_keys=True)
        f.write("\n")


if __name__ == "__main__":
    sys.exit(main())
