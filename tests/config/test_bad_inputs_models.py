"""The bad-input catalogue of what a model directory holds: config.json (its encoding, its JSON, every sizing number
and typed key), the tokenizer files, the weights and their index, a score model's normalizer, LoRA adapters
(adapter_config.json, an adapter trained for another base model), GGUF files and PaddleNLP checkpoints. Each case
runs the program that reads it (a stage's entry point or a tool) and must exit 2 with one line naming the file
and key, and write nothing (tests/bad_input_harness.py)."""
import gzip
import json
import os
import shutil

import numpy as np
import pytest

from alignment.commands import convert_checkpoint, import_gguf, merge_lora
from alignment.rm import run_reward
from alignment.sft import run_sft
from tests.bad_input_harness import case, run_case, write
from tests.helpers import REPO

SFT_CONFIG = os.path.join(REPO, "config", "tiny", "sft_argument.json")
PADDLENLP_FIXTURE = os.path.join(REPO, "tests", "fixtures", "paddlenlp_checkpoints")
DEEP = 100_000


def checkpoint(t, m, config=None, config_text=None, files=None, name="ckpt") -> str:
    """A copy of the tiny model with config.json keys changed (None deletes), or its text replaced, and files
    written (name -> str / bytes)."""
    path = t / name
    shutil.copytree(m, path)
    if config is not None:
        data = json.load(open(path / "config.json"))
        data.update(config)
        data = {k: v for k, v in data.items() if v is not None}
        config_text = json.dumps(data, indent=2)
    if config_text is not None:
        write(path / "config.json", config_text)
    for file, content in (files or {}).items():
        write(path / file, content)
    return str(path)


def sft_on(**kwargs):
    """SFT (one step) of a broken copy of the tiny model."""
    def build(t, m):
        path = checkpoint(t, m, **kwargs)
        return lambda: run_sft.main([SFT_CONFIG, "--model_name_or_path", path, "--output_dir", str(t / "out"),
                                     "--disable_tqdm", "--eval_datasets", "", "--max_steps", "1"])
    return build


def score_model_with(normalizer: str):
    """A reward-model run from a score-model checkpoint whose score_normalizer.json holds `normalizer`."""
    def build(t, m):
        from alignment.models.score_model import ScoreModel

        path = str(t / "rm")
        ScoreModel.from_pretrained(m).save_pretrained(path, tokenizer_dir=m)
        write(os.path.join(path, "score_normalizer.json"), normalizer)
        return lambda: run_reward.main([os.path.join(REPO, "config", "tiny", "rm_argument.json"),
                                        "--model_name_or_path", path, "--output_dir", str(t / "out"),
                                        "--disable_tqdm", "--eval_datasets", "", "--max_steps", "1"])
    return build


def tokenizer_config(m, **changes) -> str:
    data = json.load(open(os.path.join(m, "tokenizer_config.json")))
    data.update(changes)
    return json.dumps(data)


def sft_tokenizer(**changes):
    return lambda t, m: sft_on(files={"tokenizer_config.json": tokenizer_config(m, **changes)})(t, m)


def other_base_adapter(t, hidden=64):
    """A LoRA adapter saved from a model of another shape (hidden size `hidden`) than the tiny model."""
    from alignment.models import LlamaConfig, LlamaForCausalLM
    from alignment.models.lora import apply_lora, save_adapter

    model = LlamaForCausalLM(LlamaConfig(vocab_size=1024, hidden_size=hidden, intermediate_size=176,
                                         num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2))
    apply_lora(model, 4, 8.0, 0.0, ["q_proj", "v_proj"])
    path = str(t / "adapter")
    save_adapter(model, path, "someone/other-base", "CAUSAL_LM")
    return path


def tiny_adapter(t, m, **config_changes):
    """A LoRA adapter of the tiny model with adapter_config.json keys changed."""
    from alignment.models import LlamaForCausalLM
    from alignment.models.lora import apply_lora, save_adapter

    model = LlamaForCausalLM.from_pretrained(m)
    apply_lora(model, 4, 8.0, 0.0, ["q_proj", "v_proj"])
    path = str(t / "adapter")
    save_adapter(model, path, m, "CAUSAL_LM")
    file = os.path.join(path, "adapter_config.json")
    data = json.load(open(file))
    data.update(config_changes)
    write(file, json.dumps(data))
    return path


def merge(adapter_of, *extra):
    def build(t, m):
        adapter = adapter_of(t, m)
        return lambda: merge_lora.main(["--adapter", adapter, "--base", m, "--output", str(t / "out"), *extra])
    return build


def sft_with_adapter(t, m):
    adapter = other_base_adapter(t)
    return lambda: run_sft.main([SFT_CONFIG, "--model_name_or_path", m, "--output_dir", str(t / "out"),
                                 "--disable_tqdm", "--eval_datasets", "", "--max_steps", "1", "--lora", "true",
                                 "--lora_path", adapter, "--lora_rank", "4", "--lora_alpha", "8",
                                 "--lora_target_modules", "q_proj,v_proj"])


def gguf_file(t, **metadata):
    """A small LLaMA GGUF file whose llama.* metadata is `metadata` over sane values (a value None is left out)."""
    import gguf

    path = str(t / "model.gguf")
    writer = gguf.GGUFWriter(path, "llama")
    values = {"vocab_size": 4, "embedding_length": 8, "feed_forward_length": 16, "block_count": 1,
              "attention.head_count": 2, "context_length": 32, "attention.layer_norm_rms_epsilon": 1e-5, **metadata}
    for key, value in values.items():
        if value is None:
            continue
        add = writer.add_string if isinstance(value, str) else (
            writer.add_float32 if isinstance(value, float) else writer.add_uint32)
        add(f"llama.{key}", value)
    writer.add_tensor("token_embd.weight", np.zeros((4, 8), np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def import_file(make):
    def build(t, m):
        path = make(t)
        return lambda: import_gguf.main(["--gguf", path, "--output", str(t / "out")])
    return build


def truncated_gguf(t):
    path = gguf_file(t)
    data = open(path, "rb").read()
    return write(t / "model.gguf", data[: len(data) // 3])


def huge_count_gguf(t):
    """A GGUF header claiming 2^60 tensors and 2^60 metadata entries."""
    return write(t / "model.gguf", b"GGUF" + (3).to_bytes(4, "little") + (2 ** 60).to_bytes(8, "little") * 2)


def paddlenlp_copy(**config):
    def build(t, m):
        source = next(os.path.join(PADDLENLP_FIXTURE, d) for d in sorted(os.listdir(PADDLENLP_FIXTURE))
                      if os.path.isdir(os.path.join(PADDLENLP_FIXTURE, d)))
        path = t / "pdnlp"
        shutil.copytree(source, path)
        data = json.load(open(path / "config.json"))
        data.update(config)
        write(path / "config.json", json.dumps(data))
        return lambda: convert_checkpoint.main(["--input", str(path), "--output", str(t / "out")])
    return build


CASES = [
    # --- config.json: the file
    case("config.json non-UTF-8", sft_on(config_text=b'{\n  "hidden_size": 128,\n  "x": "\xe9"\n}'),
         "config.json line 3", "UTF-8"),
    case("config.json gzip-compressed", sft_on(config_text=gzip.compress(b'{"hidden_size": 128}')), "config.json",
         "gzip-compressed"),
    case("config.json nested 100,000 deep", sft_on(config_text='{"x": ' + "[" * DEEP + "]" * DEEP + "}"),
         "config.json line 1", "nested too deeply"),
    case("config.json a JSON array", sft_on(config_text="[1, 2]"), "config.json", "JSON object"),
    case("config.json a duplicate key", sft_on(config_text='{"hidden_size": 128, "hidden_size": 64}'),
         "config.json", "'hidden_size' is given twice"),
    # --- config.json: numbers and typed keys
    case("config.json hidden_size 0", sft_on(config={"hidden_size": 0}), "config.json",
         "'hidden_size' must be a positive integer"),
    case("config.json vocab_size beyond int64", sft_on(config={"vocab_size": 2 ** 64}), "config.json",
         "'vocab_size'"),
    case("config.json num_hidden_layers true", sft_on(config={"num_hidden_layers": True}), "config.json",
         "'num_hidden_layers' must be a positive integer"),
    case("config.json rms_norm_eps NaN", sft_on(config_text=None, config={"rms_norm_eps": float("nan")}),
         "config.json", "'rms_norm_eps'"),
    case("config.json rope_theta Infinity", sft_on(config={"rope_theta": float("inf")}), "config.json",
         "'rope_theta'"),
    case("config.json tie_word_embeddings \"false\"", sft_on(config={"tie_word_embeddings": "false"}), "config.json",
         "'tie_word_embeddings' must be true or false"),
    case("config.json attention_bias 1", sft_on(config={"attention_bias": 1}), "config.json",
         "'attention_bias' must be true or false"),
    case("config.json pad_token_id a float", sft_on(config={"pad_token_id": 3.5}), "config.json",
         "'pad_token_id' must be a token id"),
    case("config.json eos_token_id a string", sft_on(config={"eos_token_id": "2"}), "config.json",
         "'eos_token_id'"),
    case("config.json bos_token_id -2", sft_on(config={"bos_token_id": -2}), "config.json", "'bos_token_id'"),
    case("config.json heads that do not divide hidden_size", sft_on(config={"num_attention_heads": 3,
                                                                            "num_key_value_heads": 3,
                                                                            "head_dim": None}),
         "config.json", "'hidden_size' 128", "num_attention_heads 3"),
    case("config.json model_type a number", sft_on(config={"model_type": 5}), "config.json", "model_type"),
    # --- the tokenizer files
    case("tokenizer_config.json broken JSON", sft_on(files={"tokenizer_config.json": '{"bos_token": '}),
         "tokenizer_config.json line 1"),
    case("tokenizer_config.json non-UTF-8", sft_on(files={"tokenizer_config.json": b'{"x": "\xff"}'}),
         "tokenizer_config.json line 1", "UTF-8"),
    case("tokenizer_config.json add_bos_token \"false\"", sft_tokenizer(add_bos_token="false"),
         "tokenizer_config.json", "'add_bos_token' must be true or false"),
    case("tokenizer_config.json model_max_length a word", sft_tokenizer(model_max_length="big"),
         "tokenizer_config.json", "'model_max_length'"),
    case("tokenizer_config.json chat_template a number", sft_tokenizer(chat_template=5), "tokenizer_config.json",
         "'chat_template'"),
    case("tokenizer_config.json eos_token a number", sft_tokenizer(eos_token=5), "tokenizer_config.json",
         "'eos_token'"),
    case("chat_template.jinja non-UTF-8", lambda t, m: sft_on(files={
        "tokenizer_config.json": tokenizer_config(m, chat_template=None),
        "chat_template.jinja": b"{{ messages \xff }}"})(t, m), "chat_template.jinja line 1", "UTF-8"),
    case("a chat template with a syntax error", sft_tokenizer(chat_template="{% for m in messages %}{{ m }"),
         "tokenizer_config.json", "chat template does not compile"),
    case("tokenizer.json gzip-compressed", lambda t, m: sft_on(files={
        "tokenizer.json": gzip.compress(open(os.path.join(m, "tokenizer.json"), "rb").read())})(t, m),
         "tokenizer.json", "gzip-compressed"),
    # --- the weights
    case("model.safetensors header length beyond the file", sft_on(files={
        "model.safetensors": (2 ** 62).to_bytes(8, "little") + b"{}"}), "model.safetensors"),
    case("model.safetensors not safetensors at all", sft_on(files={"model.safetensors": b"PK\x03\x04zip"}),
         "model.safetensors"),
    case("model.safetensors.index.json weight_map a list", sft_on(files={
        "model.safetensors.index.json": '{"weight_map": ["model.safetensors"]}'}), "model.safetensors.index.json",
         "weight_map"),
    case("model.safetensors.index.json non-UTF-8", sft_on(files={
        "model.safetensors.index.json": b'{"weight_map": {"\xff": "model.safetensors"}}'}),
         "model.safetensors.index.json line 1", "UTF-8"),
    case("model.safetensors.index.json naming a missing shard", sft_on(files={
        "model.safetensors.index.json": '{"weight_map": {"lm_head.weight": "model-00002.safetensors"}}'}),
         "model-00002.safetensors", "missing"),
    # --- a score model's normalizer
    case("score_normalizer.json broken JSON", score_model_with('{"type": "RunningMeanStd", "mean": '),
         "score_normalizer.json line 1", "JSON"),
    case("score_normalizer.json mean NaN", score_model_with('{"type": "RunningMeanStd", "mean": NaN, "var": 1.0, '
                                                            '"count": 3}'), "score_normalizer.json", "'mean'"),
    case("score_normalizer.json count a string", score_model_with('{"type": "RunningMeanStd", "mean": 0.0, '
                                                                  '"var": 1.0, "count": "3"}'),
         "score_normalizer.json", "'count'"),
    case("score_normalizer.json an unknown type", score_model_with('{"type": "Magic", "mean": 0.0, "var": 1.0, '
                                                                   '"count": 3}'), "score_normalizer.json", "Magic"),
    # --- LoRA adapters
    case("a LoRA adapter trained for another base model (merge_lora)", merge(lambda t, m: other_base_adapter(t)),
         "adapter", "another base model", "someone/other-base", "hidden_size"),
    case("a LoRA adapter trained for another base model (lora_path)", sft_with_adapter, "adapter",
         "another base model", "someone/other-base"),
    case("adapter_config.json r given as a string", merge(lambda t, m: tiny_adapter(t, m, r="4")),
         "adapter_config.json", "'r' must be a positive integer"),
    case("adapter_config.json r 0", merge(lambda t, m: tiny_adapter(t, m, r=0)), "adapter_config.json", "'r'"),
    case("adapter_config.json lora_alpha NaN", merge(lambda t, m: tiny_adapter(t, m, lora_alpha=float("nan"))),
         "adapter_config.json", "'lora_alpha'"),
    case("adapter_config.json target_modules a number", merge(lambda t, m: tiny_adapter(t, m, target_modules=5)),
         "adapter_config.json", "'target_modules'"),
    case("adapter_config.json use_rslora \"no\"", merge(lambda t, m: tiny_adapter(t, m, use_rslora="no")),
         "adapter_config.json", "'use_rslora' must be true or false"),
    case("adapter_config.json non-UTF-8", merge(lambda t, m: (tiny_adapter(t, m), write(
        t / "adapter" / "adapter_config.json", b'{"peft_type": "LORA\xff"}'))[0]), "adapter_config.json line 1",
         "UTF-8"),
    case("adapter_model.safetensors truncated", merge(lambda t, m: (tiny_adapter(t, m), write(
        t / "adapter" / "adapter_model.safetensors", b"\x10\x00\x00\x00\x00\x00\x00\x00{"))[0]),
         "adapter_model.safetensors"),
    # --- GGUF files
    case("a truncated GGUF file", import_file(truncated_gguf), "model.gguf"),
    case("a GGUF header claiming 2^60 entries", import_file(huge_count_gguf), "model.gguf"),
    case("GGUF embedding_length a string", import_file(lambda t: gguf_file(t, embedding_length="eight")),
         "model.gguf", "llama.embedding_length"),
    case("GGUF block_count 0", import_file(lambda t: gguf_file(t, block_count=0)), "model.gguf",
         "llama.block_count"),
    case("GGUF rms epsilon NaN", import_file(lambda t: gguf_file(t, **{"attention.layer_norm_rms_epsilon":
                                                                          float("nan")})),
         "model.gguf", "layer_norm_rms_epsilon"),
    case("a directory given as the GGUF file", lambda t, m: (os.makedirs(t / "dir.gguf"), lambda: import_gguf.main(
        ["--gguf", str(t / "dir.gguf"), "--output", str(t / "out")]))[1], "dir.gguf", "a directory"),
    # --- PaddleNLP checkpoints
    case("PaddleNLP config num_hidden_layers \"2\"", paddlenlp_copy(num_hidden_layers="2"), "config.json",
         "'num_hidden_layers'"),
    case("PaddleNLP config hidden_size 0", paddlenlp_copy(hidden_size=0), "config.json", "'hidden_size'"),
]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_bad_model_files(tmp_path, tiny_model_dir, capsys, case):
    run_case(case, tmp_path, tiny_model_dir, capsys)


def test_the_catalogue_names_each_case_once():
    assert len({c.id for c in CASES}) == len(CASES)
