"""Qwen3-MoE and ERNIE 4.5 MoE (tests/fixtures/models/qwen3_moe, ernie4_5_moe, made by tools/make_model_fixtures.py
from transformers' Qwen3MoeForCausalLM and Ernie4_5_MoeForCausalLM; logits, greedy tokens and saved names are checked
with the other families in tests/models/test_model_families.py): the load-balancing loss is transformers' (mask all ones
and right-padded), each family's routing detail (norm_topk_prob, e_score_correction_bias) gives transformers' logits
with it switched off as well, the dense and sparse expert paths agree in values and gradients, the sparse layers are the
ones the keys name, LoRA reaches the experts, replayed choices are used, and a bad MoE key is one line naming it."""
import json
import os
import shutil

import numpy as np
import paddle
import pytest
from safetensors.numpy import load_file, save_file

from alignment.commands import generate as generate_command
from alignment.config.moe_keys import moe_settings
from alignment.models import LlamaForCausalLM
from alignment.models.llama import MLP
from alignment.models.lora import apply_lora, load_adapter
from alignment.models.moe import MoeBlock, expert_load, moe_blocks, router_aux_loss, use_dense_experts
from alignment.models.static_decode import StaticDecoder
from tests.bad_input_harness import case, run_case
from tests.models.test_model_families import assert_close_to_transformers, greedy

FIXTURES = os.path.join(os.path.dirname(os.path.dirname(__file__)), "fixtures", "models")
MOE = ["qwen3_moe", "ernie4_5_moe"]
RIGHT_PAD = 4  # as tools/make_model_fixtures.py masks row 1 for aux_loss_right_padded


def load(name, path=None):
    return LlamaForCausalLM.from_pretrained(path or os.path.join(FIXTURES, name)), reference(name)


def reference(name):
    return load_file(os.path.join(FIXTURES, name, "reference.safetensors"))


@pytest.mark.parametrize("name", MOE)
def test_the_load_balancing_loss_is_transformers(name):
    model, ref = load(name)
    ids = paddle.to_tensor(ref["input_ids"])
    model(ids)
    np.testing.assert_allclose(float(router_aux_loss(model)), ref["aux_loss"], rtol=1e-5)
    mask = np.ones_like(ref["input_ids"])
    mask[1, -RIGHT_PAD:] = 0
    model(ids, attention_mask=paddle.to_tensor(mask))
    padded = float(router_aux_loss(model, paddle.to_tensor(mask)))
    np.testing.assert_allclose(padded, ref["aux_loss_right_padded"], rtol=1e-5)
    assert abs(padded - float(ref["aux_loss"])) > 1e-3  # the mask changes it: the check sees the masking


def with_config(tmp_path, name, **keys):
    path = tmp_path / name
    shutil.copytree(os.path.join(FIXTURES, name), path)
    config = json.load(open(path / "config.json"))
    config.update(keys)
    json.dump(config, open(path / "config.json", "w"))
    return path


def test_qwen3_moe_without_norm_topk_prob_gives_transformers_logits(tmp_path):
    model, ref = load("qwen3_moe", str(with_config(tmp_path, "qwen3_moe", norm_topk_prob=False)))
    logits = model(paddle.to_tensor(ref["input_ids"])).logits.numpy()
    assert_close_to_transformers(logits, ref["logits_without_norm_topk_prob"])
    assert np.abs(logits - ref["logits"]).max() > 0.1


def test_ernie_moe_without_the_score_correction_gives_transformers_logits(tmp_path):
    path = with_config(tmp_path, "ernie4_5_moe")
    weights = load_file(str(path / "model.safetensors"))
    corrections = [k for k in weights if k.endswith("mlp.moe_statics.e_score_correction_bias")]
    assert len(corrections) == 2 and all(np.abs(weights[k]).max() > 0 for k in corrections)  # layers 1 and 2
    save_file({k: np.zeros_like(v) if k in corrections else v for k, v in weights.items()},
              str(path / "model.safetensors"), metadata={"format": "pt"})
    model, ref = load("ernie4_5_moe", str(path))
    logits = model(paddle.to_tensor(ref["input_ids"])).logits.numpy()
    assert_close_to_transformers(logits, ref["logits_without_score_correction"])
    assert np.abs(logits - ref["logits"]).max() > 0.1


@pytest.mark.parametrize("name", MOE)
def test_dense_and_sparse_experts_agree_in_values_and_gradients(name):
    model, ref = load(name)
    model.train()
    ids = paddle.to_tensor(ref["input_ids"])
    grads = []
    for dense in (False, True):
        use_dense_experts(model, dense)
        model.clear_gradients()
        logits = model(ids).logits
        (logits.square().mean() + router_aux_loss(model)).backward()
        block = moe_blocks(model)[0]
        grads.append((logits.numpy(), block.experts[int(block.chosen[0, 0])].up_proj.weight.grad.numpy(),
                      block.gate.weight.grad.numpy()))
    for sparse, dense in zip(*grads):  # the experts' GEMMs run other row counts: last bits differ on MKL's AVX2 path
        np.testing.assert_allclose(sparse, dense, rtol=1e-5, atol=5e-6)
    assert np.abs(grads[0][1]).max() > 0 and np.abs(grads[0][2]).max() > 0


def test_the_sparse_layers_are_the_ones_the_keys_name():
    qwen, ernie = (LlamaForCausalLM.from_pretrained(os.path.join(FIXTURES, n)) for n in MOE)
    assert [type(layer.mlp) for layer in qwen.model.layers] == [MoeBlock, MLP, MoeBlock]  # mlp_only_layers [1]
    assert [type(layer.mlp) for layer in ernie.model.layers] == [MLP, MoeBlock, MoeBlock]  # start index 1
    assert moe_blocks(qwen)[0].shared_experts is None and moe_blocks(ernie)[0].shared_experts is not None
    qwen_keys = dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=8)
    assert moe_settings("qwen3_moe", dict(qwen_keys, decoder_sparse_step=2, mlp_only_layers=[3]), 6).sparse_layers \
        == (1, 5)
    ernie_keys = dict(moe_num_experts=4, moe_k=2, moe_intermediate_size=8)
    assert moe_settings("ernie4_5_moe", dict(ernie_keys, moe_layer_start_index=0, moe_layer_interval=2,
                                             moe_layer_end_index=4), 8).sparse_layers == (1, 3)
    settings = moe_settings("ernie4_5_moe", dict(ernie_keys, moe_num_shared_experts=3), 2)
    assert settings.shared_size == 24 and settings.sparse_layers == (1,)


def test_the_saved_config_keeps_the_moe_keys_as_the_file_spells_them(tmp_path):
    """transformers 5 writes Qwen3-MoE's expert count as num_local_experts, the Qwen checkpoints as num_experts."""
    path = tmp_path / "qwen"
    shutil.copytree(os.path.join(FIXTURES, "qwen3_moe"), path)
    config = json.load(open(path / "config.json"))
    assert config["num_local_experts"] == 8 and "num_experts" not in config
    config["num_experts"] = config.pop("num_local_experts")
    json.dump(config, open(path / "config.json", "w"))
    model, ref = load("qwen3_moe", str(path))
    assert_close_to_transformers(model(paddle.to_tensor(ref["input_ids"])).logits.numpy(), ref["logits"])
    model.save_pretrained(str(tmp_path / "saved"))
    saved = json.load(open(tmp_path / "saved" / "config.json"))
    assert saved["num_experts"] == 8 and saved["norm_topk_prob"] is True and saved["mlp_only_layers"] == [1]
    assert saved["architectures"] == ["Qwen3MoeForCausalLM"]


@pytest.mark.parametrize("name", MOE)
def test_the_compiled_decode_step_gives_transformers_greedy_tokens(name):
    """Inside a compiled program the experts take the dense path (no data-dependent shapes)."""
    model, ref = load(name)
    np.testing.assert_array_equal(greedy(model, ref, static=StaticDecoder(model)), ref["greedy_tokens"])


def test_lora_wraps_every_expert_and_not_the_router(tmp_path):
    model, ref = load("qwen3_moe")
    ids = paddle.to_tensor(ref["input_ids"])
    before = model(ids).logits.numpy()
    share = expert_load(model)[1]  # layer 2's experts: one gets no token of these inputs
    idle, busy = int(np.argmin(share)), int(np.argmax(share))
    assert share[idle] == 0 and share[busy] > 0.2
    wrapped = apply_lora(model, rank=4, alpha=8.0)
    experts = [n for n in wrapped if ".mlp.experts." in n]
    assert len(experts) == 2 * 8 * 3  # two sparse layers, 8 experts, gate/up/down each
    assert not any(n.endswith("mlp.gate") for n in wrapped)
    np.testing.assert_array_equal(model(ids).logits.numpy(), before)  # B starts at zero
    layers = dict(model.named_sublayers())
    for expert in (idle, busy):
        layer = layers[f"model.layers.2.mlp.experts.{expert}.down_proj"]
        layer.lora_B.set_value(paddle.full(layer.lora_B.shape, 0.5))
        changed = model(ids).logits.numpy()
        assert (np.abs(changed - before).max() > 1e-3) == (expert == busy)  # an idle expert's adapter runs on nothing
    model.save_pretrained(str(tmp_path / "adapter"))
    again, _ = load("qwen3_moe")
    apply_lora(again, rank=4, alpha=8.0)
    load_adapter(again, str(tmp_path / "adapter"))
    np.testing.assert_array_equal(again(ids).logits.numpy(), changed)


@pytest.mark.parametrize("name", MOE)
def test_replayed_choices_are_used_and_the_load_is_recorded(name):
    model, ref = load(name)
    ids = paddle.to_tensor(ref["input_ids"])
    logits = model(ids).logits.numpy()
    load_shares = expert_load(model)
    assert len(load_shares) == 2 and all(abs(share.sum() - 1) < 1e-9 for share in load_shares)
    for block in moe_blocks(model):
        block.replay = block.chosen
    np.testing.assert_array_equal(model(ids).logits.numpy(), logits)
    for block in moe_blocks(model):
        block.replay = (block.chosen + 1) % block.settings.num_experts
    assert np.abs(model(ids).logits.numpy() - logits).max() > 0.1


def moe_model_with(**keys):
    """generate.py on a copy of the tiny model read as Qwen3-MoE with `keys` set in its config.json."""
    def build(t, m):
        path = t / "ckpt"
        shutil.copytree(m, path)
        config = json.load(open(path / "config.json"))
        config.update(model_type="qwen3_moe", num_experts=4, num_experts_per_tok=2, moe_intermediate_size=8)
        config.update(keys)
        json.dump({k: v for k, v in config.items() if v is not None}, open(path / "config.json", "w"))
        return lambda: generate_command.main(["--model", str(path), "--prompt", "hi", "--max-new-tokens", "1"])
    return build


@pytest.mark.parametrize("keys, fragment", [
    (dict(num_experts_per_tok=5), "key 'num_experts_per_tok' 5 is more than the 4 experts"),
    (dict(moe_intermediate_size=None), "missing key 'moe_intermediate_size'"),
    (dict(mlp_only_layers=[-1]), "key 'mlp_only_layers' must be a list of layer indices (integers >= 0), got [-1]"),
    (dict(model_type="ernie4_5_moe", moe_num_experts=4, moe_k=2, num_nextn_predict_layers=1),
     "key 'num_nextn_predict_layers' 1 is not supported for model_type 'ernie4_5_moe'"),
], ids=["top-k", "missing", "layer-index", "mtp"])
def test_a_moe_key_we_cannot_use_is_one_line_naming_it(keys, fragment, tmp_path, tiny_model_dir, capsys):
    run_case(case(fragment.split("'")[1], moe_model_with(**keys), "config.json", fragment), tmp_path,
             tiny_model_dir, capsys)


def test_the_load_balancing_loss_under_pipeline_stages_is_refused_in_one_line():
    """The pipeline's stage losses have no auxiliary term: a config asking for it stops before fleet is touched."""
    from alignment.models import LlamaConfig
    from alignment.wrappers.pipeline import build_pipeline_model

    config = json.load(open(os.path.join(FIXTURES, "qwen3_moe", "config.json")))
    config.update(output_router_logits=True, num_hidden_layers=4)
    with pytest.raises(ValueError, match=r"x/config.json: key 'output_router_logits' true .* pipeline parallelism"):
        build_pipeline_model(LlamaConfig.from_dict(config), "x", "causal", 2, None)
