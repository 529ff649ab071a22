"""An exported model (alignment/inference/export.py) loaded with paddle.inference, standing in for the model in
`alignment.models.generate`: one call per batch fills the KV cache, then one call per new token."""
from __future__ import annotations

import os
from types import SimpleNamespace
from typing import NamedTuple, Optional

import paddle

from alignment.inputs import POSITIVE_INT, TEXT, Kind, check_keys, integer, list_of, read_json
from alignment.models.llama import positions_from_mask
from alignment.models.static_decode import EXPORT_FORMAT

EXPORT_INFO = "export.json"  # in <export>/inference/, written by export.export


class StepOutput(NamedTuple):
    logits: paddle.Tensor  # [b, 1, vocab]
    past_key_values: list  # per layer (k, v), each [b, kv_heads, t, d]


class ExportedLM:
    """The exported program behind the calls the decode engine makes of a model:
    lm(input_ids, attention_mask=, position_ids=, past_key_values=) -> .logits [b, 1, vocab], .past_key_values.
    Without past_key_values it is the prefill (empty caches, positions from the mask, as the dynamic model). The
    program appends the new tokens' keys and values to the cache (it has no cache_column input), so the engine
    decodes it with engine.AppendSteps."""

    writes_cache_columns = False

    def __init__(self, predictor, info: dict, device: str, threads: Optional[int] = None):
        self.predictor, self.info, self.device, self.threads = predictor, info, device, threads
        self.config = SimpleNamespace(vocab_size=info["vocab_size"], num_hidden_layers=info["num_hidden_layers"],
                                      num_key_value_heads=info["num_key_value_heads"], head_dim=info["head_dim"],
                                      tensor_parallel_degree=1)  # what the engine reads of a config
        self.dtype = info["dtype"]  # of the KV cache

    def __call__(self, input_ids, attention_mask=None, position_ids=None, past_key_values=None, **_ignored):
        if attention_mask is None:
            attention_mask = paddle.ones_like(input_ids)
        if past_key_values is None:
            shape = [input_ids.shape[0], self.info["num_key_value_heads"], 0, self.info["head_dim"]]
            caches = [paddle.zeros(shape, self.info["dtype"])] * (2 * self.info["num_hidden_layers"])
        else:
            caches = [t for kv in past_key_values for t in kv]
        if position_ids is None:
            if past_key_values is not None:
                raise ValueError("a decode step needs position_ids")
            position_ids = positions_from_mask(attention_mask)
        outs = self.predictor.run([input_ids, attention_mask.astype("int64"), position_ids, *caches])
        # copies: the returned tensors share the predictor's output buffers, which the next run may write while
        # reading them as inputs (measured: a batch of 2 after a batch of 3 decoded wrong without the copies)
        outs = [t.clone() for t in outs]
        return StepOutput(outs[0].unsqueeze(1), list(zip(outs[1::2], outs[2::2])))


def find_export(model_dir: str) -> str:
    """The inference/ folder of an export (or model_dir itself when it is that folder)."""
    for folder in (os.path.join(model_dir, "inference"), model_dir):
        if os.path.exists(os.path.join(folder, EXPORT_INFO)):
            return folder
    raise FileNotFoundError(f"{model_dir}: no inference/{EXPORT_INFO} (export it with tools/export_model.py)")


EXPORT_KEYS = {"format": TEXT, "program": Kind("a file name in the export's folder", lambda v: isinstance(v, str) and v
                                  and v == os.path.basename(v) and v not in (".", "..") and "\\" not in v),
               "num_hidden_layers": POSITIVE_INT, "num_key_value_heads": POSITIVE_INT, "head_dim": POSITIVE_INT,
               "vocab_size": POSITIVE_INT, "max_position_embeddings": POSITIVE_INT,
               "dtype": Kind("float32, float16 or bfloat16", lambda v: v in ("float32", "float16", "bfloat16")),
               "eos_token_ids": list_of(integer(0)), "pad_token_id": integer(0)}


def read_info(folder: str) -> dict:
    """export.json, every key ExportedLM and predict read checked (a program name may not leave the folder)."""
    path = os.path.join(folder, EXPORT_INFO)
    info = read_json(path, "export file")
    if isinstance(info, dict) and info.get("format") != EXPORT_FORMAT:
        raise ValueError(f"{path}: written by an older tools/export_model.py (a fixed-width graph without a KV "
                         f"cache, format {info.get('format')!r}, expected {EXPORT_FORMAT!r}); re-export the model")
    return check_keys(info, EXPORT_KEYS, path, required=list(EXPORT_KEYS), what="export file")


def pick_device(device: str = "auto") -> str:
    """"gpu" when asked for, or (auto) when Paddle is built with CUDA and sees a device; else "cpu"."""
    has_gpu = paddle.is_compiled_with_cuda() and paddle.device.cuda.device_count() > 0
    if device == "gpu" and not has_gpu:
        raise ValueError("--device gpu: this Paddle has no CUDA device")
    return "gpu" if device == "gpu" or (device == "auto" and has_gpu) else "cpu"


def load(model_dir: str, device: str = "auto", threads: Optional[int] = None) -> ExportedLM:
    """The exported program of model_dir as an ExportedLM on the chosen device. threads: the CPU predictor's math
    threads, which Paddle applies to MKL and OpenMP alike, process-wide; None keeps the process's MKL_NUM_THREADS,
    so the numbers of anything else the process computes do not change (a predictor made with 1 thread turned
    later in-process training runs' results into a 1-thread MKL's). Measured on 2 cores
    (benchmarks/bench_predict.py): 1 thread decoded faster (SmolLM2 1.03x of the dynamic model's speed vs 0.89x
    with 2; the tiny model 0.68x vs 0.44x): pass --threads 1 for a process that only predicts."""
    from paddle import inference

    folder = find_export(model_dir)
    info = read_info(folder)
    files = [os.path.join(folder, info["program"] + ext) for ext in (".json", ".pdiparams")]
    for file in files:
        if not os.path.exists(file):
            raise FileNotFoundError(f"{file}: missing from the export; re-export the model")
    device = pick_device(device)
    paddle.set_device(device)
    config = inference.Config(*files)
    if device == "gpu":
        config.enable_use_gpu(256, 0)
    else:
        config.disable_gpu()
        # measured (paddle 3.3.1): with oneDNN the CPU predictor gave all-zero logits for the old fixed-width graph
        # and crashes ("corrupted double-linked list") on this program; the plain kernels match the dynamic model
        config.disable_mkldnn()
        # the predictor sets its math threads for the whole process (MKL and OpenMP); unless asked, keep the
        # process's own, so a program that also trains (or a test) computes as before
        config.set_cpu_math_library_num_threads(threads or int(os.environ.get("MKL_NUM_THREADS") or 1))
    config.disable_glog_info()
    return ExportedLM(inference.create_predictor(config), info, device, threads)


def weight_dtype(model) -> str:
    """"float32", "bfloat16", ...: the dtype of the weights, and so of the KV cache."""
    return str(model.model.embed_tokens.weight.dtype).replace("paddle.", "")


def has_export(model_dir: str) -> bool:
    return any(os.path.exists(os.path.join(folder, EXPORT_INFO)) for folder in (os.path.join(model_dir, "inference"),
                                                                                model_dir))


def checkpoint_dir(model_dir: str) -> str:
    """The HF-layout checkpoint of model_dir: an export's hf/, or model_dir itself."""
    hf = os.path.join(model_dir, "hf")
    return hf if os.path.exists(os.path.join(hf, "config.json")) else model_dir


def load_checkpoint(model_dir: str, device: str = "auto"):
    """The dynamic model of a checkpoint (or of an export's hf/) for `generate`, with the .info and .device an
    ExportedLM has (PaddleNLP's --mode dynamic)."""
    from alignment.models import LlamaForCausalLM, Tokenizer

    folder = checkpoint_dir(model_dir)
    if not os.path.isdir(folder):
        raise FileNotFoundError(f"{model_dir}: model directory not found")
    device = pick_device(device)
    paddle.set_device(device)
    model = LlamaForCausalLM.from_pretrained(folder)
    model.eval()
    cfg = model.config
    model.info = {"eos_token_ids": cfg.eos_token_ids, "pad_token_id": Tokenizer.from_pretrained(folder).pad_token_id,
                  "max_position_embeddings": cfg.max_position_embeddings, "dtype": weight_dtype(model)}
    model.device = device
    return model
