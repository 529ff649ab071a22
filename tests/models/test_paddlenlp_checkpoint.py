"""Checkpoints written by PaddleNLP itself (tests/fixtures/paddlenlp_checkpoints/, tools/make_paddlenlp_fixture.py:
PaddleNLP 2.8.1 LLaMA, PaddleNLP 3.0.0b4 LLaMA / Qwen2) load into our models with PaddleNLP's logits, directly and
through tools/convert_checkpoint.py; damaged ones are errors naming the tensor or the file."""
import json
import os
import shutil

import numpy as np
import paddle
import pytest
from safetensors import safe_open

from alignment.models import LlamaForCausalLM
from alignment.models.checkpoint import load_weights
from alignment.models.config import LlamaConfig
from alignment.models.paddlenlp_checkpoint import is_paddlenlp_checkpoint, separate_lm_head
from alignment.models.score_model import ScoreModel
from tests.helpers import REPO
from alignment.commands import convert_checkpoint

FIXTURES = os.path.join(REPO, "tests", "fixtures", "paddlenlp_checkpoints")
with open(os.path.join(FIXTURES, "expected.json"), encoding="utf-8") as _f:
    EXPECTED = json.load(_f)
ATOL = 1e-5


def fixture(variant):
    return os.path.join(FIXTURES, variant)


def logits_diff(model, variant):
    """Max |our logits - PaddleNLP's| on the recorded input ids."""
    entry = EXPECTED[variant]
    logits = model(paddle.to_tensor(np.array(entry["input_ids"], dtype="int64"))).logits.numpy()
    return float(np.abs(logits - np.array(entry["logits"], dtype="float32")).max())


def copy(variant, tmp_path):
    return shutil.copytree(fixture(variant), tmp_path / variant)


def test_fixtures_were_written_by_paddlenlp():
    assert {e["paddlenlp"].split(".")[0] for e in EXPECTED.values()} == {"2", "3"}
    assert {e["model_class"] for e in EXPECTED.values()} == {"LlamaForCausalLM", "Qwen2ForCausalLM"}
    assert all(is_paddlenlp_checkpoint(fixture(v)) for v in EXPECTED)


@pytest.mark.parametrize("variant", sorted(EXPECTED))
def test_from_pretrained_gives_paddlenlp_logits(variant):
    model = LlamaForCausalLM.from_pretrained(fixture(variant))
    assert model.config.model_type == EXPECTED[variant]["model_class"][:-len("ForCausalLM")].lower()
    assert logits_diff(model, variant) < ATOL


def test_tied_embeddings_follow_what_paddlenlp_computed():
    """PaddleNLP 2.8 LLaMA keeps its own head despite tie_word_embeddings; PaddleNLP 3 ties (and saves the shared
    embedding as lm_head.weight too)."""
    untied = LlamaForCausalLM.from_pretrained(fixture("llama_fused_tied_sharded_safetensors"))
    assert not untied.config.tie_word_embeddings and hasattr(untied, "lm_head")
    for variant in ("llama_tied_pdparams_v3", "qwen2_tied_safetensors_v3"):
        tied = LlamaForCausalLM.from_pretrained(fixture(variant))
        assert tied.config.tie_word_embeddings and not hasattr(tied, "lm_head")
    qwen = LlamaForCausalLM.from_pretrained(fixture("qwen2_fused_sharded_v3"))
    assert qwen.model.layers[0].self_attn.k_proj.bias is not None


@pytest.mark.parametrize("variant", ["llama_fused_tied_sharded_safetensors", "llama_pdparams",
                                     "qwen2_tied_safetensors_v3"])
def test_converter_round_trip_keeps_the_logits(variant, tmp_path):
    out = convert_checkpoint.main(["--input", fixture(variant), "--output", str(tmp_path / "hf")])
    assert not is_paddlenlp_checkpoint(out)
    with open(os.path.join(out, "config.json"), encoding="utf-8") as f:
        config = json.load(f)
    assert not {"use_flash_attention", "fuse_attention_qkv", "paddlenlp_version", "seq_length"} & set(config)
    with safe_open(os.path.join(out, "model.safetensors"), framework="numpy") as f:
        names = list(f.keys())
        assert all(n.startswith("model.") or n == "lm_head.weight" for n in names)
        if "lm_head.weight" in names:  # HF's [vocab, hidden]
            assert f.get_slice("lm_head.weight").get_shape() == [config["vocab_size"], config["hidden_size"]]
    assert logits_diff(LlamaForCausalLM.from_pretrained(out), variant) < ATOL


def test_score_model_starts_from_a_paddlenlp_causal_lm():
    model = ScoreModel.from_pretrained(fixture("llama_pdparams"))
    assert model.head_initialised


def _resave_pdparams(file, edit):
    state = paddle.load(file)
    edit(state)
    paddle.save(state, file)


def test_missing_tensor_names_the_tensor(tmp_path):
    path = copy("llama_pdparams", tmp_path)
    _resave_pdparams(os.path.join(path, "model_state.pdparams"),
                     lambda s: s.pop("llama.layers.1.mlp.up_proj.weight"))
    with pytest.raises(ValueError, match=r"model\.layers\.1\.mlp\.up_proj\.weight") as err:
        LlamaForCausalLM.from_pretrained(str(path))
    assert str(path) in str(err.value)


def test_wrong_shape_names_the_tensor_and_file(tmp_path):
    path = copy("qwen2_fused_sharded_v3", tmp_path)
    index = json.load(open(os.path.join(path, "model_state.pdparams.index.json")))
    file = os.path.join(path, index["weight_map"]["qwen2.layers.0.mlp.down_proj.weight"])
    _resave_pdparams(file, lambda s: s.update({"qwen2.layers.0.mlp.down_proj.weight": paddle.zeros([16, 32])}))
    with pytest.raises(ValueError, match=rf"{file}: tensor model\.layers\.0\.mlp\.down_proj\.weight has shape"):
        LlamaForCausalLM.from_pretrained(str(path))


def test_fused_qkv_not_matching_the_config_names_the_tensor_and_file(tmp_path):
    path = copy("qwen2_fused_sharded_v3", tmp_path)
    config = json.load(open(os.path.join(path, "config.json")))
    config["num_key_value_heads"] = 1
    json.dump(config, open(os.path.join(path, "config.json"), "w"))
    with pytest.raises(ValueError, match=r"model_state-0000\d-of-00005\.pdparams: tensor "
                                         r"qwen2\.layers\.0\.self_attn\.qkv_proj\.(weight|bias) has shape"):
        LlamaForCausalLM.from_pretrained(str(path))


def test_missing_or_damaged_files_are_named(tmp_path):
    sharded = copy("qwen2_fused_sharded_v3", tmp_path)
    os.remove(os.path.join(sharded, "model_state-00003-of-00005.pdparams"))
    with pytest.raises(FileNotFoundError, match="model_state-00003-of-00005.pdparams: listed in"):
        LlamaForCausalLM.from_pretrained(str(sharded))
    single = copy("llama_pdparams", tmp_path)
    with open(os.path.join(single, "model_state.pdparams"), "r+b") as f:
        f.truncate(1000)
    with pytest.raises(ValueError, match=r"model_state\.pdparams: cannot read PaddleNLP weights"):
        LlamaForCausalLM.from_pretrained(str(single))
    safetensors = copy("llama_fused_tied_sharded_safetensors", tmp_path)
    with open(os.path.join(safetensors, "model-00002-of-00005.safetensors"), "r+b") as f:
        f.truncate(1000)
    with pytest.raises(ValueError, match=r"model-00002-of-00005\.safetensors: cannot read safetensors file"):
        LlamaForCausalLM.from_pretrained(str(safetensors))


def test_tensor_parallel_slices_are_refused(tmp_path):
    path = copy("llama_pdparams", tmp_path)
    os.rename(os.path.join(path, "model_state.pdparams"), os.path.join(path, "model_state.tp00.pdparams"))
    with pytest.raises(ValueError, match=r"model_state\.tp00\.pdparams: a tensor/pipeline-parallel slice"):
        LlamaForCausalLM.from_pretrained(str(path))


@pytest.mark.parametrize("key, value, message", [
    ("rope_scaling_type", "linear", "rope scaling 'linear'"),
    ("alibi", True, "ALiBi"),
])
def test_unsupported_paddlenlp_config_is_refused(tmp_path, key, value, message):
    path = copy("llama_pdparams", tmp_path)
    config = json.load(open(os.path.join(path, "config.json")))
    config.update({key: value, "rope_scaling_factor": 2.0})
    json.dump(config, open(os.path.join(path, "config.json"), "w"))
    with pytest.raises(ValueError, match=message):
        LlamaConfig.from_pretrained(str(path))


@pytest.mark.parametrize("same, separate", [(True, False), (False, True)])
def test_square_lm_head_is_told_apart_by_its_values(tmp_path, same, separate):
    """vocab == hidden: the stored head's shape cannot say whether it is the shared embedding."""
    config = LlamaConfig(vocab_size=8, hidden_size=8, intermediate_size=8, num_hidden_layers=1,
                         num_attention_heads=2, tie_word_embeddings=True)
    config.save_pretrained(str(tmp_path))
    state = {"llama." + k[len("model."):]: v for k, v in LlamaForCausalLM(config).state_dict().items()
             if k.startswith("model.")}  # our [in, out] Linear layout is PaddleNLP's
    embed = state["llama.embed_tokens.weight"]
    state["lm_head.weight"] = embed if same else embed + 1.0
    paddle.save(state, str(tmp_path / "model_state.pdparams"))
    assert separate_lm_head(str(tmp_path)) is separate
    model = LlamaForCausalLM.from_pretrained(str(tmp_path))
    assert model.config.tie_word_embeddings is not separate
    assert load_weights(model, str(tmp_path)) == []


def test_bfloat16_pdparams_and_safetensors_load_alike(tmp_path):
    """PaddleNLP's usual bfloat16 weights, in both file forms: the same model, close to the float32 logits."""
    from safetensors.paddle import save_file

    pdparams, safetensors = copy("llama_pdparams", tmp_path), tmp_path / "safetensors"
    state = {k: v.astype("bfloat16") for k, v in paddle.load(os.path.join(pdparams, "model_state.pdparams")).items()}
    paddle.save(state, os.path.join(pdparams, "model_state.pdparams"))
    os.makedirs(safetensors)
    shutil.copy(os.path.join(pdparams, "config.json"), safetensors)
    save_file({k: v.contiguous() for k, v in state.items()}, str(safetensors / "model.safetensors"))
    first = LlamaForCausalLM.from_pretrained(str(pdparams))
    second = LlamaForCausalLM.from_pretrained(str(safetensors))
    assert logits_diff(first, "llama_pdparams") < 0.1
    assert logits_diff(first, "llama_pdparams") == logits_diff(second, "llama_pdparams")
