"""The RoPE kernel (csrc/rope.cc) against the composition it replaces (rope.py apply_rope, then the transpose to
head-major): the same bits forward and in x's gradient, in both rotate-half layouts, on any thread count; the
inputs it does not take go to the composition; a model's attention gives the same bits with it as without."""
import numpy as np
import paddle
import pytest

from alignment import cpu_kernels as kernels
from alignment.models import LlamaConfig, LlamaForCausalLM
from alignment.models.rope import apply_rope, rotate_half_matrix


def _leaf(array):
    t = paddle.to_tensor(array)
    t.stop_gradient = False
    return t


def _composed(x, cos, sin, interleaved):
    return apply_rope(x, cos, sin, rotate_half_matrix(x.shape[-1], paddle.float32, interleaved)).transpose([0, 2, 1, 3])


@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("shape", [[2, 5, 3, 8], [3, 37, 9, 64], [1, 1, 4, 2]])
def test_rope_forward_and_gradient_have_the_compositions_bits(lib, shape, interleaved):
    rng = np.random.default_rng(sum(shape))
    x_np, cos_np, sin_np = (rng.standard_normal(shape).astype("float32") * 3 for _ in range(3))
    x_np[0, 0, 0, :2] = [1e30, -1e-30]  # products that round away from the exact sum
    dy = paddle.to_tensor(rng.standard_normal([shape[0], shape[2], shape[1], shape[3]]).astype("float32"))
    results = []
    for fn in (lambda x, c, s: lib.alignment_rope(x, c, s, interleaved, 2), lambda x, c, s: _composed(x, c, s,
                                                                                                      interleaved)):
        x = _leaf(x_np)
        y = fn(x, paddle.to_tensor(cos_np), paddle.to_tensor(sin_np))
        (y * dy).sum().backward()
        results.append((y.numpy(), x.grad.numpy()))
    (ours, our_grad), (theirs, their_grad) = results
    assert ours.shape == (shape[0], shape[2], shape[1], shape[3])
    np.testing.assert_array_equal(ours, theirs)
    np.testing.assert_array_equal(our_grad, their_grad)
    # and against a hand-written rotation: feature i turns with i + d/2 (or 2i with 2i + 1)
    d = shape[-1]
    turned = np.empty_like(x_np)
    if interleaved:
        turned[..., 0::2], turned[..., 1::2] = -x_np[..., 1::2], x_np[..., 0::2]
    else:
        turned[..., :d // 2], turned[..., d // 2:] = -x_np[..., d // 2:], x_np[..., :d // 2]
    want = (x_np.astype("float64") * cos_np + turned.astype("float64") * sin_np).transpose(0, 2, 1, 3)
    usual = np.abs(want) < 1e20  # the head with 1e30 apart
    np.testing.assert_allclose(ours[usual], want[usual], rtol=1e-5, atol=1e-4)


def test_rope_has_the_same_bits_on_one_thread_as_on_two(lib):
    rng = np.random.default_rng(3)
    x, cos, sin = (paddle.to_tensor(rng.standard_normal([4, 64, 9, 64]).astype("float32")) for _ in range(3))
    one, two = (lib.alignment_rope(x, cos, sin, False, t).numpy() for t in (1, 2))
    assert (one == two).all()


def test_inputs_the_rope_kernel_does_not_take_go_to_paddle(lib, monkeypatch):
    monkeypatch.setenv("ALIGNMENT_CPU_KERNELS", "on")
    x = paddle.ones([2, 3, 4, 8])
    assert kernels.rope(x, x, x, False).shape == [2, 4, 3, 8]
    assert kernels.rope(x, x[:, :, :1], x, False) is None  # tables not expanded over the heads
    assert kernels.rope(x.astype("bfloat16"), x.astype("bfloat16"), x.astype("bfloat16"), False) is None
    assert kernels.rope(x.reshape([6, 4, 8]), x.reshape([6, 4, 8]), x.reshape([6, 4, 8]), False) is None
    assert kernels.rope(x, _leaf(np.ones([2, 3, 4, 8], "float32")), x, False) is None  # a table with a gradient


@pytest.mark.parametrize("family", ["llama", "qwen3", "ernie4_5"])  # plain; q and k normed; interleaved pairs
def test_a_model_has_the_same_bits_with_the_rope_kernel_as_without(lib, monkeypatch, family):
    config = LlamaConfig(model_type=family, vocab_size=97, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, initializer_range=0.3)
    ids = paddle.to_tensor(np.random.default_rng(6).integers(0, 97, [2, 11]))
    out = {}
    for rope_kernel in (True, False):
        monkeypatch.setattr(kernels, "_chosen", {name: name == "rope" and rope_kernel for name in kernels.REPLACES})
        monkeypatch.setenv("ALIGNMENT_CPU_KERNELS", "auto")
        paddle.seed(11)
        model = LlamaForCausalLM(config)
        log_probs, _ = model.token_log_probs(model(ids).hidden_states[:, :-1], ids[:, 1:])
        log_probs.sum().backward()
        out[rope_kernel] = [log_probs.numpy(), model.model.layers[0].self_attn.q_proj.weight.grad.numpy(),
                            model.model.layers[1].self_attn.k_proj.weight.grad.numpy()]
    for ours, theirs in zip(out[True], out[False]):
        np.testing.assert_array_equal(ours, theirs)
