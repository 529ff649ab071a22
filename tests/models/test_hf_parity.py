"""Our Paddle model against logits HF transformers computed for the same weights (tools/make_hf_reference.py)."""
import os

import numpy as np
import paddle
import pytest

from alignment.models import GenerationConfig, LlamaForCausalLM, generate

FIXTURES = os.path.join(os.path.dirname(os.path.dirname(__file__)), "fixtures", "hf_reference")
MODELS = ["llama", "llama_tied", "qwen2"]


def _load(name):
    path = os.path.join(FIXTURES, name)
    return LlamaForCausalLM.from_pretrained(path), lambda f: np.load(os.path.join(path, f))


@pytest.mark.parametrize("name", MODELS)
def test_logits_match_transformers(name):
    model, fixture = _load(name)
    logits = model(paddle.to_tensor(fixture("input_ids.npy"))).logits.numpy()
    assert np.abs(logits - fixture("logits.npy")).max() < 1e-4


@pytest.mark.parametrize("name", MODELS)
def test_left_padded_logits_match_transformers(name):
    model, fixture = _load(name)
    mask = fixture("attention_mask_left.npy")
    logits = model(paddle.to_tensor(fixture("input_ids_left.npy")), attention_mask=paddle.to_tensor(mask)).logits
    valid = mask.astype(bool)
    assert np.abs(logits.numpy()[valid] - fixture("logits_left.npy")[valid]).max() < 1e-4


@pytest.mark.parametrize("name", MODELS)
def test_greedy_tokens_match_transformers(name):
    model, fixture = _load(name)
    expected = fixture("greedy_tokens.npy")
    prompt = paddle.to_tensor(expected[:, :6])
    out = generate(model, prompt, paddle.ones_like(prompt), GenerationConfig(max_new_tokens=10, do_sample=False))
    np.testing.assert_array_equal(out.sequences.numpy(), expected)


def test_qwen2_checkpoint_has_qkv_bias_and_tied_has_no_lm_head():
    qwen, _ = _load("qwen2")
    assert qwen.model.layers[0].self_attn.q_proj.bias is not None
    assert qwen.model.layers[0].self_attn.o_proj.bias is None
    tied, _ = _load("llama_tied")
    assert not hasattr(tied, "lm_head")
