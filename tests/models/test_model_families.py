"""Model families and RoPE scalings against HF transformers (tests/fixtures/models, made by
tools/make_model_fixtures.py): Llama 3.1 (`llama3`), linear, dynamic NTK and YaRN RoPE scaling on a tied LLaMA
(Llama 3.2's layout), Qwen3 dense (per-head q/k RMSNorm, head_dim != hidden / heads, tied) and ERNIE 4.5 dense
(interleaved RoPE, head_dim != hidden / heads, tied; its own checks in tests/models/test_ernie4_5.py), Qwen3-MoE and
ERNIE 4.5 MoE (their own checks in tests/models/test_moe.py). Logits equal
transformers' within 1e-5 relative, greedy tokens through the decode engine (KV cache) are transformers' own,
save -> load keeps the HF tensor names and the logits, and a rope type we lack is one line naming those we have."""
import json
import math
import os
import shutil

import numpy as np
import paddle
import pytest
from safetensors.numpy import load_file

from alignment.commands import generate as generate_command
from alignment.models import GenerationConfig, LlamaConfig, LlamaForCausalLM, generate
from alignment.models.fused_decode import fusable
from alignment.models.rope import ROPE_TYPES, RopeConfig, rope_cos_sin
from alignment.models.static_decode import StaticDecoder
from tests.bad_input_harness import case, run_case

FIXTURES = os.path.join(os.path.dirname(os.path.dirname(__file__)), "fixtures", "models")
NAMES = ["llama3", "linear", "dynamic", "yarn", "qwen3", "ernie4_5", "qwen3_moe", "ernie4_5_moe"]
NEW_TOKENS = 8


def load(name, path=None):
    """-> (our model from the fixture (or `path`), transformers' reference arrays)."""
    model = LlamaForCausalLM.from_pretrained(path or os.path.join(FIXTURES, name))
    return model, load_file(os.path.join(FIXTURES, name, "reference.safetensors"))


def logits_of(model, ids) -> np.ndarray:
    return model(paddle.to_tensor(ids)).logits.numpy()


def assert_close_to_transformers(ours, reference):
    """Within 1e-5 relative: each logit to 1e-5 of itself or of the largest |logit| (near-zero logits)."""
    np.testing.assert_allclose(ours, reference, rtol=1e-5, atol=1e-5 * np.abs(reference).max())


def greedy(model, reference, **kwargs) -> np.ndarray:
    prompt = paddle.to_tensor(reference["greedy_tokens"][:, :-NEW_TOKENS])
    config = GenerationConfig(max_new_tokens=NEW_TOKENS, do_sample=False)
    return generate(model, prompt, paddle.ones_like(prompt), config, **kwargs).sequences.numpy()


@pytest.mark.parametrize("name", NAMES)
def test_logits_match_transformers(name):
    model, reference = load(name)
    assert_close_to_transformers(logits_of(model, reference["input_ids"]), reference["logits"])


@pytest.mark.parametrize("fused", [True, False], ids=["fused", "layers"])
@pytest.mark.parametrize("name", NAMES)
def test_greedy_tokens_through_the_decode_engine_match_transformers(name, fused):
    model, reference = load(name)
    # Qwen3's q/k norms and the MoE families' experts decode through the layers
    assert fusable(model) == (name not in ("qwen3", "qwen3_moe", "ernie4_5_moe"))
    np.testing.assert_array_equal(greedy(model, reference, fused=fused), reference["greedy_tokens"])


def test_dynamic_ntk_fixture_runs_past_the_original_length_and_decodes_across_it():
    model, reference = load("dynamic")
    original = model.config.max_position_embeddings
    assert reference["input_ids"].shape[1] > original  # the logits compared above include rescaled positions
    assert reference["greedy_tokens"].shape[1] - NEW_TOKENS < original < reference["greedy_tokens"].shape[1]
    # the compiled decode step computes each row's length inside the program: the same tokens
    np.testing.assert_array_equal(greedy(model, reference, static=StaticDecoder(model)), reference["greedy_tokens"])


@pytest.mark.parametrize("name", NAMES)
def test_save_then_load_keeps_the_hf_tensor_names_config_and_logits(name, tmp_path):
    model, reference = load(name)
    model.save_pretrained(str(tmp_path / "saved"))
    names = lambda path: {k: v.shape for k, v in load_file(os.path.join(path, "model.safetensors")).items()}  # noqa
    assert names(tmp_path / "saved") == names(os.path.join(FIXTURES, name))  # tied: no lm_head.weight either
    hf = json.load(open(os.path.join(FIXTURES, name, "config.json")))
    saved = json.load(open(tmp_path / "saved" / "config.json"))
    rope = dict(hf["rope_parameters"])
    assert saved["rope_theta"] == rope.pop("rope_theta")
    assert (saved["rope_scaling"] or {"rope_type": "default"}) == rope
    assert saved["tie_word_embeddings"] is True and saved["head_dim"] == hf["head_dim"]
    assert saved["architectures"] == hf["architectures"] and saved["model_type"] == hf["model_type"]
    assert saved.get("use_bias") == hf.get("use_bias")  # ERNIE's one bias key, as transformers reads it
    again, _ = load(name, str(tmp_path / "saved"))
    ids = reference["input_ids"]
    np.testing.assert_array_equal(logits_of(again, ids), logits_of(model, ids))


@pytest.mark.parametrize("name", ["linear", "yarn"])
def test_transformers_4_rope_scaling_with_the_legacy_type_key_loads_the_same(name, tmp_path):
    """transformers 4.x writes `rope_scaling` with `type` (older) and a top-level rope_theta."""
    path = tmp_path / name
    shutil.copytree(os.path.join(FIXTURES, name), path)
    config = json.load(open(path / "config.json"))
    rope = config.pop("rope_parameters")
    config["rope_theta"] = rope.pop("rope_theta")
    config["rope_scaling"] = {"type": rope.pop("rope_type"), **rope}
    json.dump(config, open(path / "config.json", "w"))
    model, reference = load(name, str(path))
    assert_close_to_transformers(logits_of(model, reference["input_ids"]), reference["logits"])


def test_qwen3_has_per_head_q_k_norms_and_no_attention_bias():
    model, _ = load("qwen3")
    attn, config = model.model.layers[0].self_attn, model.config
    assert config.head_dim == 32 != config.hidden_size // config.num_attention_heads
    assert attn.q_norm.weight.shape == [32] and attn.k_norm.weight.shape == [32]
    assert all(p.bias is None for p in (attn.q_proj, attn.k_proj, attn.v_proj, attn.o_proj))
    assert not hasattr(model, "lm_head")


def inv_freq(rope_type, positions=((0,),), **params):
    scaling = {"rope_type": rope_type, **params}
    return ROPE_TYPES[rope_type](scaling, 16, 10000.0, 16, paddle.to_tensor(positions, dtype="int64"))


def test_rope_type_functions():
    plain, factor = inv_freq("default")
    assert factor == 1.0 and plain.shape == [1, 8]
    np.testing.assert_allclose(inv_freq("linear", factor=4.0)[0].numpy(), plain.numpy() / 4, rtol=1e-6)
    llama3, _ = inv_freq("llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                         original_max_position_embeddings=64)
    assert llama3.numpy()[0, 0] == plain.numpy()[0, 0]  # short wavelengths kept, long ones divided by the factor
    np.testing.assert_allclose(llama3.numpy()[0, 3:], plain.numpy()[0, 3:] / 8, rtol=1e-6)
    dynamic, _ = inv_freq("dynamic", positions=[[0, 15], [0, 31]], factor=2.0)  # per row: length 16, then 32
    np.testing.assert_array_equal(dynamic.numpy()[0], plain.numpy()[0])
    assert (dynamic.numpy()[1, 1:] < plain.numpy()[0, 1:]).all()
    _, yarn_factor = inv_freq("yarn", factor=4.0, original_max_position_embeddings=8)
    assert yarn_factor == pytest.approx(0.1 * math.log(4.0) + 1)
    assert inv_freq("yarn", factor=4.0, attention_factor=1.5)[1] == 1.5
    cos, _ = rope_cos_sin(paddle.zeros([1, 1], "int64"), 16, RopeConfig(10000.0, {"rope_type": "yarn", "factor": 4.0}),
                          paddle.float32)
    np.testing.assert_allclose(cos.numpy(), yarn_factor, rtol=1e-6)  # cos and sin carry the attention factor


@pytest.mark.parametrize("scaling, fragment", [
    ({"rope_type": "longrope", "factor": 2.0}, "rope_type 'longrope' is not supported"),
    ({"rope_type": "llama3", "factor": 8.0}, "needs 'low_freq_factor'"),
    ({"type": "linear", "factor": 0}, "'factor' must be a positive number"),
], ids=["unknown", "missing", "zero"])
def test_bad_rope_scaling_is_a_value_error_naming_the_key(scaling, fragment):
    with pytest.raises(ValueError, match="'rope_scaling'") as err:
        LlamaConfig.from_dict(dict(vocab_size=8, hidden_size=8, intermediate_size=8, num_hidden_layers=1,
                                   num_attention_heads=2, rope_scaling=scaling))
    assert fragment in str(err.value)


def test_mistral_sliding_window_shorter_than_the_positions_is_refused_naming_the_key():
    shape = dict(vocab_size=8, hidden_size=8, intermediate_size=8, num_hidden_layers=1, num_attention_heads=2,
                 model_type="mistral", max_position_embeddings=32768)
    with pytest.raises(ValueError, match="^key 'sliding_window' 4096: sliding-window attention is not supported"):
        LlamaConfig.from_dict(dict(shape, sliding_window=4096))  # Mistral 7B v0.1
    assert LlamaConfig.from_dict(dict(shape, sliding_window=None)).model_type == "mistral"  # v0.3
    assert LlamaConfig.from_dict(dict(shape, model_type="qwen2", sliding_window=4096)).model_type == "qwen2"  # off


def with_config(key, value):
    """generate.py on a copy of the tiny model whose config.json has `key` set to `value`."""
    def build(t, m):
        path = t / "ckpt"
        shutil.copytree(m, path)
        config = json.load(open(path / "config.json"))
        config[key] = value
        json.dump(config, open(path / "config.json", "w"))
        return lambda: generate_command.main(["--model", str(path), "--prompt", "hi", "--max-new-tokens", "1"])
    return build


@pytest.mark.parametrize("key, value", [
    ("rope_scaling", {"rope_type": "longrope", "factor": 2.0}),
    ("rope_scaling", {"type": "su", "factor": 2.0}),
    ("rope_parameters", {"rope_type": "proportional", "rope_theta": 10000.0}),
], ids=["rope_type", "legacy-type", "transformers-5"])
def test_an_unknown_rope_type_is_one_line_naming_the_supported_types(key, value, tmp_path, tiny_model_dir, capsys):
    kind = value.get("rope_type", value.get("type"))
    run_case(case(f"{key} {kind}", with_config(key, value), "config.json", f"key {key!r}",
                  f"rope_type {kind!r} is not supported", "supported: default, linear, dynamic, llama3, yarn"),
             tmp_path, tiny_model_dir, capsys)
