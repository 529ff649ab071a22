"""ERNIE 4.5 dense (tests/fixtures/models/ernie4_5, made by tools/make_model_fixtures.py from transformers'
Ernie4_5ForCausalLM; logits and greedy tokens are checked with the other families in
tests/models/test_model_families.py): the interleaved RoPE is what makes the logits match, PaddleFormers' names and
config keys load to the same model, `use_bias` gives every projection a bias and is written back as one key, and a
PaddleFormers key we do not support is one line naming it. Greedy tokens through the compiled decode step are
transformers'."""
import json
import os
import shutil

import numpy as np
import paddle
import pytest
from safetensors.numpy import load_file, save_file

from alignment.commands import generate as generate_command
from alignment.models import LlamaConfig, LlamaForCausalLM
from alignment.models.rope import rotate_half_matrix
from alignment.models.static_decode import StaticDecoder
from tests.bad_input_harness import case, run_case
from tests.models.test_model_families import greedy

FIXTURE = os.path.join(os.path.dirname(os.path.dirname(__file__)), "fixtures", "models", "ernie4_5")


def reference():
    return load_file(os.path.join(FIXTURE, "reference.safetensors"))


def logits_of(path) -> np.ndarray:
    model = LlamaForCausalLM.from_pretrained(str(path))
    return model(paddle.to_tensor(reference()["input_ids"])).logits.numpy()


def fixture_config() -> dict:
    return json.load(open(os.path.join(FIXTURE, "config.json")))


def test_rotate_half_pairs_neighbours_when_interleaved():
    x = paddle.to_tensor([[1.0, 2.0, 3.0, 4.0]])
    np.testing.assert_array_equal((x @ rotate_half_matrix(4, paddle.float32, interleaved=True)).numpy(),
                                  [[-2.0, 1.0, -4.0, 3.0]])  # ERNIE / GPT-J: (x0, x1) -> (-x1, x0)
    np.testing.assert_array_equal((x @ rotate_half_matrix(4, paddle.float32)).numpy(),
                                  [[-3.0, -4.0, 1.0, 2.0]])  # HF's rotate-half: (x0, x2) -> (-x2, x0)


def test_the_same_weights_with_llamas_rope_layout_give_other_logits(tmp_path):
    """The fixture tells the layouts apart: read as a LLaMA (rotate-half RoPE), its logits are far off."""
    shutil.copytree(FIXTURE, tmp_path / "as_llama")
    config = fixture_config()
    config.update(model_type="llama", architectures=["LlamaForCausalLM"])
    json.dump(config, open(tmp_path / "as_llama" / "config.json", "w"))
    gap = np.abs(logits_of(tmp_path / "as_llama") - reference()["logits"]).max()
    assert gap > 0.1, gap  # the families' tolerance is 1e-5 of the largest |logit| (~5.5)


def test_the_compiled_decode_step_gives_transformers_greedy_tokens():
    """The interleaved tables inside the compiled step (static_decode.py); fused and layer steps: the families test."""
    model = LlamaForCausalLM.from_pretrained(FIXTURE)
    np.testing.assert_array_equal(greedy(model, reference(), static=StaticDecoder(model)),
                                  reference()["greedy_tokens"])


def paddleformers_checkpoint(path, tie: bool = True) -> None:
    """The fixture's weights as PaddleFormers' ERNIE 4.5 writes them (the ERNIE-4.5-*-Paddle layout that Baidu's
    tools/paddle2torch converts): `ernie.` prefix, Paddle's [in, out] Linear weights, q/k/v fused as [all q | all k |
    all v] in `qkv_proj`, gate/up as [gate | up] in `up_gate_proj`, lm_head.weight the [vocab, hidden] embedding when
    tied ([hidden, vocab] when not); its config.json keys."""
    hf = load_file(os.path.join(FIXTURE, "model.safetensors"))
    out = {}
    for name, tensor in hf.items():
        name = "ernie." + name[len("model."):]
        if ".self_attn.q_proj." in name:
            parts = [hf["model." + name[len("ernie."):].replace("q_proj", p)].T for p in ("q_proj", "k_proj",
                                                                                        "v_proj")]
            out[name.replace("q_proj", "qkv_proj")] = np.ascontiguousarray(np.concatenate(parts, axis=1))
        elif ".mlp.gate_proj." in name:
            up = hf["model." + name[len("ernie."):].replace("gate_proj", "up_proj")]
            out[name.replace("gate_proj", "up_gate_proj")] = np.ascontiguousarray(np.concatenate([tensor.T, up.T], 1))
        elif name.endswith(("o_proj.weight", "down_proj.weight")):
            out[name] = np.ascontiguousarray(tensor.T)
        elif not any(p in name for p in (".k_proj.", ".v_proj.", ".up_proj.")):
            out[name] = tensor  # embedding and norms
    embedding = hf["model.embed_tokens.weight"]
    out["lm_head.weight"] = embedding if tie else np.ascontiguousarray(embedding.T)
    os.makedirs(path)
    save_file(out, os.path.join(path, "model.safetensors"), metadata={"format": "np"})
    config = {key: value for key, value in fixture_config().items() if key not in ("rope_parameters", "dtype")}
    config.update(rope_theta=500000.0, dtype="float32", tie_word_embeddings=tie, architectures=["Ernie4_5ForCausalLM"],
                  compression_ratio=1.0, use_rmsnorm=True, fuse_rms_norm=False, fuse_rope=False, fuse_linear=False,
                  fuse_swiglu=False, fuse_ln=False, use_flash_attention=False, max_sequence_length=None,
                  weight_share_add_bias=True, paddlenlp_version=None)
    json.dump(config, open(os.path.join(path, "config.json"), "w"))


def test_a_paddleformers_named_checkpoint_loads_to_the_same_logits(tmp_path):
    paddleformers_checkpoint(tmp_path / "paddle")
    names = set(load_file(str(tmp_path / "paddle" / "model.safetensors")))
    assert "ernie.layers.0.self_attn.qkv_proj.weight" in names and "ernie.layers.1.mlp.up_gate_proj.weight" in names
    np.testing.assert_array_equal(logits_of(tmp_path / "paddle"), logits_of(FIXTURE))
    model = LlamaForCausalLM.from_pretrained(str(tmp_path / "paddle"))
    model.save_pretrained(str(tmp_path / "saved"))  # written back in transformers' names and keys
    saved = json.load(open(tmp_path / "saved" / "config.json"))
    assert saved["model_type"] == "ernie4_5" and saved["use_bias"] is False and "fuse_rope" not in saved
    assert set(load_file(str(tmp_path / "saved" / "model.safetensors"))) == set(
        load_file(os.path.join(FIXTURE, "model.safetensors")))


def test_an_untied_paddleformers_head_is_read_in_paddles_layout(tmp_path):
    paddleformers_checkpoint(tmp_path / "paddle", tie=False)
    model = LlamaForCausalLM.from_pretrained(str(tmp_path / "paddle"))
    assert not model.config.tie_word_embeddings
    np.testing.assert_array_equal(model.lm_head.weight.numpy(),  # ours is [hidden, vocab]: the embedding transposed
                                  load_file(os.path.join(FIXTURE, "model.safetensors"))["model.embed_tokens.weight"].T)


def test_what_paddleformers_1_2_writes_loads_the_same(tmp_path):
    """PaddleFormers 1.2.0's save_pretrained of the fixture (run once in a venv with it): transformers' tensor names,
    the same weights as one shard + index, and a config.json whose top-level rope_theta is its class default 10000
    beside rope_parameters' 500000 (which transformers and PaddleFormers use)."""
    os.makedirs(tmp_path / "pf")
    shard = "model-00001-of-00001.safetensors"
    shutil.copy(os.path.join(FIXTURE, "model.safetensors"), tmp_path / "pf" / shard)
    names = load_file(os.path.join(FIXTURE, "model.safetensors"))
    json.dump({"metadata": {"total_size": sum(t.nbytes for t in names.values())},
               "weight_map": {name: shard for name in names}}, open(tmp_path / "pf" / "model.safetensors.index.json", "w"))
    config = {key: value for key, value in fixture_config().items() if key not in ("dtype", "transformers_version")}
    config.update(fuse_rms_norm=False, initializer_range=0.0721651751193053, paddleformers_version="1.2.0",
                  rope_theta=10000, torch_dtype="float32")
    json.dump(config, open(tmp_path / "pf" / "config.json", "w"))
    assert LlamaConfig.from_pretrained(str(tmp_path / "pf")).rope_theta == 500000.0
    np.testing.assert_array_equal(logits_of(tmp_path / "pf"), logits_of(FIXTURE))


def test_use_bias_gives_every_projection_a_bias_and_is_saved_as_one_key(tmp_path):
    config = LlamaConfig.from_dict({**fixture_config(), "use_bias": True})
    assert config.attention_bias and config.mlp_bias
    model = LlamaForCausalLM(config)
    layer = model.model.layers[0]
    projections = [getattr(layer.self_attn, p) for p in ("q_proj", "k_proj", "v_proj", "o_proj")] + [
        getattr(layer.mlp, p) for p in ("gate_proj", "up_proj", "down_proj")]
    assert all(p.bias is not None for p in projections)
    model.save_pretrained(str(tmp_path / "biased"))
    saved = json.load(open(tmp_path / "biased" / "config.json"))
    assert saved["use_bias"] is True and "attention_bias" not in saved and "mlp_bias" not in saved
    assert LlamaConfig.from_pretrained(str(tmp_path / "biased")).mlp_bias
    with pytest.raises(ValueError, match="one 'use_bias' for the attention and the MLP"):
        LlamaConfig(**{**LlamaConfig.from_dict(fixture_config()).__dict__, "mlp_bias": True})


def ernie_with(**keys):
    """generate.py on a copy of the tiny model read as ERNIE 4.5 with `keys` set in its config.json."""
    def build(t, m):
        path = t / "ckpt"
        shutil.copytree(m, path)
        config = json.load(open(path / "config.json"))
        config.update(model_type="ernie4_5", **keys)
        json.dump(config, open(path / "config.json", "w"))
        return lambda: generate_command.main(["--model", str(path), "--prompt", "hi", "--max-new-tokens", "1"])
    return build


@pytest.mark.parametrize("key, value, fragment", [
    ("compression_ratio", 2.0, "key 'compression_ratio' 2.0 is not supported for model_type 'ernie4_5' (only 1.0)"),
    ("use_rmsnorm", False, "key 'use_rmsnorm' false is not supported for model_type 'ernie4_5' (only true)"),
    ("use_bias", "no", "key 'use_bias' must be true or false, got 'no'"),
], ids=["compression_ratio", "use_rmsnorm", "use_bias"])
def test_an_ernie_key_we_do_not_support_is_one_line_naming_it(key, value, fragment, tmp_path, tiny_model_dir,
                                                               capsys):
    run_case(case(key, ernie_with(**{key: value}), "config.json", fragment), tmp_path, tiny_model_dir, capsys)
