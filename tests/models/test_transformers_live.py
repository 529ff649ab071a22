"""Every family live against transformers (slow; torch and transformers are not in requirements.txt, so these skip,
saying so, where they are missing; the default suite checks the same families against recorded fixtures in
tests/models/test_model_families.py). Checkpoints: the fixtures' tiny configurations (Llama 3.x RoPE scalings, Qwen3,
ERNIE 4.5, Qwen3-MoE, ERNIE 4.5 MoE) loaded by transformers itself, plus Qwen2 and Mistral made here by
transformers with random N(0, 0.2) weights. For each:
- our logits on fresh random tokens equal transformers' (fp32, 1e-5 relative);
- our greedy tokens through the decode engine (KV cache) are transformers' generate's;
- HF safetensors out: our model, its weights moved, saved by us, loads in transformers (AutoModelForCausalLM) and
  gives our logits."""
import os

import numpy as np
import paddle
import pytest

from alignment.models import GenerationConfig, LlamaForCausalLM, generate

torch = pytest.importorskip("torch", reason="torch is not installed (not in requirements.txt)")
transformers = pytest.importorskip("transformers", reason="transformers is not installed (not in requirements.txt)")

pytestmark = pytest.mark.slow

FIXTURES = os.path.join(os.path.dirname(os.path.dirname(__file__)), "fixtures", "models")
FIXTURE_FAMILIES = ["llama3", "linear", "dynamic", "yarn", "qwen3", "ernie4_5", "qwen3_moe", "ernie4_5_moe"]
SHAPE = dict(vocab_size=128, hidden_size=64, intermediate_size=32, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=256, bos_token_id=None, eos_token_id=None,
             pad_token_id=None)
MADE_HERE = {  # name: (config class, model class, keyword arguments)
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", dict(SHAPE, tie_word_embeddings=True)),
    "mistral": ("MistralConfig", "MistralForCausalLM", dict(SHAPE, tie_word_embeddings=False, sliding_window=None)),
}
NEW_TOKENS = 8


@pytest.fixture(params=FIXTURE_FAMILIES + list(MADE_HERE))
def checkpoint(request, tmp_path_factory):
    """A transformers checkpoint directory of the family."""
    name = request.param
    if name not in MADE_HERE:
        return os.path.join(FIXTURES, name)
    config_class, model_class, kwargs = MADE_HERE[name]
    torch.manual_seed(7)
    model = getattr(transformers, model_class)(getattr(transformers, config_class)(**kwargs))
    with torch.no_grad():
        for param in model.parameters():
            param.normal_(0.0, 0.2)  # far from uniform logits, so greedy margins are wide
    path = str(tmp_path_factory.mktemp(name))
    model.save_pretrained(path)
    return path


def theirs(path):
    return transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()


def tokens(rows: int, length: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(1, SHAPE["vocab_size"], size=(rows, length)).astype("int64")


def their_logits(model, ids: np.ndarray) -> np.ndarray:
    with torch.no_grad():
        return model(torch.from_numpy(ids)).logits.float().numpy()


def our_logits(model, ids: np.ndarray) -> np.ndarray:
    return model(paddle.to_tensor(ids)).logits.numpy()


def assert_close(ours, reference):
    np.testing.assert_allclose(ours, reference, rtol=1e-5, atol=1e-5 * np.abs(reference).max())


def test_logits_equal_transformers(checkpoint):
    ids = tokens(2, 20, 1)
    assert_close(our_logits(LlamaForCausalLM.from_pretrained(checkpoint), ids), their_logits(theirs(checkpoint), ids))


def test_greedy_tokens_through_the_decode_engine_are_transformers(checkpoint):
    prompt = tokens(1, 10, 2)
    with torch.no_grad():
        expected = theirs(checkpoint).generate(torch.from_numpy(prompt), attention_mask=torch.ones_like(
            torch.from_numpy(prompt)), max_new_tokens=NEW_TOKENS, do_sample=False).numpy()
    ids = paddle.to_tensor(prompt)
    ours = generate(LlamaForCausalLM.from_pretrained(checkpoint), ids, paddle.ones_like(ids),
                    GenerationConfig(max_new_tokens=NEW_TOKENS, do_sample=False)).sequences.numpy()
    np.testing.assert_array_equal(ours, expected)


def test_what_we_save_loads_in_transformers_with_our_logits(checkpoint, tmp_path):
    model = LlamaForCausalLM.from_pretrained(checkpoint)
    rng = np.random.default_rng(3)
    for param in model.parameters():  # weights of our own, not the checkpoint's
        param.set_value(param.numpy() + rng.normal(0.0, 0.01, param.shape).astype(param.numpy().dtype))
    model.save_pretrained(str(tmp_path / "ours"))
    ids = tokens(2, 16, 4)
    assert_close(their_logits(theirs(str(tmp_path / "ours")), ids), our_logits(model, ids))
