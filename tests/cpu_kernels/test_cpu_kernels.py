"""Our CPU kernels (alignment/cpu_kernels) against the Paddle compositions they replace: forward values, gradients by
Paddle's autograd of the composition, the same bits on any thread count and batch, and the fallback to Paddle's
operations without a compiler. The kernel tests skip where no library can be built (no C++ compiler)."""
import json
import os
import subprocess
import sys

import numpy as np
import paddle
import paddle.nn.functional as F
import pytest

from alignment import cpu_kernels as kernels
from alignment.cpu_kernels import build
from alignment.models import LlamaConfig, LlamaForCausalLM
from alignment.models.llama import RMSNorm
from alignment.models.logprobs import gather_log_probs, log_probs_and_entropy
from tests.helpers import REPO

THREADS = 2


def _leaf(array):
    t = paddle.to_tensor(array)
    t.stop_gradient = False
    return t


def _logits(rng, n=12, v=1000):
    """[n, v] logits with the awkward rows: -inf entries, large values, one dominant logit, constant rows."""
    z = (rng.standard_normal([n, v]) * 4).astype("float32")
    z[1, ::3] = -np.inf  # a masked part of the vocabulary
    z[2] += 3e4  # large values: only their differences matter
    z[3, 7] = 80.0  # one token takes almost all the mass
    z[4] = 0.0  # uniform
    z[5] *= 20  # wide spread
    return z


def _reference(z, labels):
    """float64 log softmax at the labels (0 where ignored) and the entropy, [n] each."""
    z = z.astype("float64")
    m = z.max(-1, keepdims=True)
    log_s = np.log(np.exp(z - m).sum(-1))  # [n]
    log_p = z - m - log_s[:, None]
    p = np.exp(log_p)
    entropy = -np.where(p > 0, p * log_p, 0.0).sum(-1)
    shifted = (z - m)[np.arange(len(z)), np.maximum(labels, 0)]  # as Paddle's kernel: z - max clipped at -64
    picked = np.where(labels >= 0, np.maximum(shifted, -64) - log_s, 0.0)
    return picked, entropy


def test_token_log_probs_forward_equals_the_float64_log_softmax_and_entropy(lib):
    rng = np.random.default_rng(0)
    z = _logits(rng)
    labels = rng.integers(0, z.shape[1], [z.shape[0]])
    labels[1] = 2  # a label whose logit is finite in the masked row
    labels[6] = -100  # padding: log p 0
    log_p, entropy, lse = lib.alignment_token_logprobs(paddle.to_tensor(z), paddle.to_tensor(labels), THREADS)
    want_log_p, want_entropy = _reference(z, labels)
    np.testing.assert_allclose(log_p.numpy(), want_log_p, atol=2e-5 * np.abs(want_log_p).max(), rtol=1e-5)
    np.testing.assert_allclose(entropy.numpy(), want_entropy, atol=2e-5 * np.log(z.shape[1]), rtol=1e-5)
    assert log_p.numpy()[6] == 0.0 and np.isfinite(entropy.numpy()).all()


def test_token_log_probs_gradient_equals_autograd_of_the_composition(lib, monkeypatch):
    rng = np.random.default_rng(1)
    z = _logits(rng, n=9, v=517)  # a vocabulary not a multiple of the vector width
    labels = rng.integers(0, z.shape[1], [3, 3])
    labels[1, 2] = -100
    weights = paddle.to_tensor(rng.standard_normal([3, 3]).astype("float32"))  # the upstream gradient
    grads = {}
    for setting in ("off", "on"):
        monkeypatch.setenv("ALIGNMENT_CPU_KERNELS", setting)
        logits = _leaf(z.reshape([3, 3, -1]))  # [B, T, V]
        (gather_log_probs(logits, paddle.to_tensor(labels)) * weights).sum().backward()
        grads[setting] = logits.grad.numpy()
    np.testing.assert_allclose(grads["on"], grads["off"], atol=1e-6)
    assert not grads["on"][1, 2].any()  # the ignored position's row: no gradient


def test_log_probs_and_entropy_route_through_the_kernel_and_agree_with_the_composition(lib, monkeypatch):
    rng = np.random.default_rng(2)
    z = _logits(rng, n=8, v=700).reshape([2, 4, 700])
    labels = paddle.to_tensor(rng.integers(0, 700, [2, 4]))
    out = {}
    for setting in ("off", "on"):
        monkeypatch.setenv("ALIGNMENT_CPU_KERNELS", setting)
        out[setting] = [t.numpy() for t in log_probs_and_entropy(paddle.to_tensor(z), labels)]
    want_log_p, want_entropy = _reference(z.reshape([8, 700]), labels.numpy().reshape([-1]))
    np.testing.assert_allclose(out["on"][0].reshape([-1]), want_log_p, rtol=1e-5, atol=1e-4)
    np.testing.assert_allclose(out["on"][1].reshape([-1]), want_entropy, rtol=1e-5, atol=1e-4)
    # Paddle's entropy is inf over -inf logits and off by 6e-4 at logits of 3e4 (float32 gaps lse - z); the kernel's
    # are the float64 values above. Log-probs: both clip z - max(z) at -64
    np.testing.assert_allclose(out["on"][0], out["off"][0], atol=1e-4, rtol=1e-5)


def _rms_composition(x, weight, eps):
    normed = x * paddle.rsqrt(paddle.square(x).mean(axis=-1, keepdim=True) + eps)
    return normed * paddle.expand(weight, normed.shape)


def test_rms_norm_forward_and_gradients_equal_the_composition(lib):
    rng = np.random.default_rng(3)
    x_np = rng.standard_normal([2, 5, 67]).astype("float32") * 3  # [b, s, H], H not a multiple of 16
    x_np[1, 4] = 0.0  # a padded position
    x_np[0, 0] *= 1e3
    w_np = rng.standard_normal([67]).astype("float32")
    dy = paddle.to_tensor(rng.standard_normal([2, 5, 67]).astype("float32"))
    results = []
    for fn in (lambda x, w: lib.alignment_rms_norm(x, w, 1e-5, THREADS)[0], lambda x, w: _rms_composition(x, w, 1e-5)):
        x, w = _leaf(x_np), _leaf(w_np)
        y = fn(x, w)
        (y * dy).sum().backward()
        results.append([y.numpy(), x.grad.numpy(), w.grad.numpy()])
    for ours, theirs in zip(*results):
        np.testing.assert_allclose(ours, theirs, atol=1e-5 * max(1.0, np.abs(theirs).max()), rtol=1e-5)


def test_swiglu_forward_and_gradients_equal_the_composition(lib):
    rng = np.random.default_rng(4)
    gate_np = (rng.standard_normal([3, 7, 45]) * 6).astype("float32")
    gate_np[0, 0, :4] = [-100.0, 100.0, -1e4, 0.0]  # saturated sigmoids
    up_np = rng.standard_normal([3, 7, 45]).astype("float32")
    dout = paddle.to_tensor(rng.standard_normal([3, 7, 45]).astype("float32"))
    results = []
    for fn in (lambda g, u: lib.alignment_swiglu(g, u, THREADS), lambda g, u: F.silu(g) * u):
        gate, up = _leaf(gate_np), _leaf(up_np)
        out = fn(gate, up)
        (out * dout).sum().backward()
        results.append([out.numpy(), gate.grad.numpy(), up.grad.numpy()])
    for ours, theirs in zip(*results):
        finite = np.isfinite(theirs)  # Paddle's silu gradient at -100 and -1e4 is NaN (inf / inf); the kernel's is 0
        assert np.isfinite(ours).all() and (~finite).sum() <= 2
        np.testing.assert_allclose(ours[finite], theirs[finite], atol=1e-5 * np.abs(theirs[finite]).max(), rtol=1e-5)


def _softmax64(scores, bias):
    x = (scores + bias).astype("float64")  # added in float32, as both sides do: a masked row's keys become equal
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def test_attention_softmax_forward_and_gradient_equal_float64_and_the_composition(lib):
    rng = np.random.default_rng(8)
    shape = [2, 3, 5, 37]  # [b, h, s, t], t not a multiple of 16
    scores_np = (rng.standard_normal(shape) * 4).astype("float32")
    bias_np = np.zeros(shape, "float32")
    bias_np[..., 30:] = -1e9  # masked keys (llama.MASK_VALUE)
    bias_np[1, 2, 4, :] = -1e9  # a query whose keys are all masked: uniform weights in float32, as Paddle's
    scores_np[0, 0, 0, 3] = 60.0  # one key takes almost all the weight
    dy_np = rng.standard_normal(shape).astype("float32")
    dy = paddle.to_tensor(dy_np)
    results = []
    for fn in (lambda s, b: lib.alignment_attention_softmax(s, b, THREADS), lambda s, b: F.softmax(s + b, axis=-1)):
        scores = _leaf(scores_np)
        probs = fn(scores, paddle.to_tensor(bias_np))
        (probs * dy).sum().backward()
        results.append([probs.numpy(), scores.grad.numpy()])
    (ours, our_grad), (theirs, their_grad) = results
    np.testing.assert_allclose(ours, theirs, atol=1e-6, rtol=1e-5)
    np.testing.assert_allclose(our_grad, their_grad, atol=1e-6, rtol=1e-5)
    want = _softmax64(scores_np, bias_np)
    np.testing.assert_allclose(ours, want, atol=1e-6, rtol=1e-5)
    np.testing.assert_allclose(our_grad, want * (dy_np - (dy_np * want).sum(-1, keepdims=True)), atol=1e-6, rtol=1e-4)
    assert (ours[0, ..., 30:] == 0).all() and np.allclose(ours[1, 2, 4], 1 / 37)
    one, two = (lib.alignment_attention_softmax(paddle.to_tensor(scores_np), paddle.to_tensor(bias_np), t).numpy()
                for t in (1, 2))
    assert (one == two).all()


def test_every_row_has_the_same_bits_on_any_thread_count_and_alone(lib):
    """Rows are independent and reduced in one fixed order: a decode step's row equals the scoring pass's."""
    rng = np.random.default_rng(5)
    z = paddle.to_tensor(rng.standard_normal([157, 600]).astype("float32"))  # enough work for 2 threads
    labels = paddle.to_tensor(rng.integers(0, 600, [157]))
    one, two = (lib.alignment_token_logprobs(z, labels, t)[0].numpy() for t in (1, 2))
    alone = lib.alignment_token_logprobs(z[5:6], labels[5:6], 2)[0].numpy()
    assert (one == two).all() and alone[0] == one[5]
    x, w = _leaf(rng.standard_normal([700, 96]).astype("float32")), _leaf(rng.standard_normal([96]).astype("float32"))
    grads = []
    for t in (1, 2):
        y, _ = lib.alignment_rms_norm(x, w, 1e-5, t)
        y.sum().backward()
        grads.append((y.numpy(), x.grad.numpy(), w.grad.numpy()))
        x.clear_gradient()
        w.clear_gradient()
    assert all((a == b).all() for a, b in zip(*grads))


def test_inputs_the_kernels_do_not_take_go_to_paddle(lib, monkeypatch):
    monkeypatch.setenv("ALIGNMENT_CPU_KERNELS", "on")
    x = paddle.ones([2, 8], dtype="bfloat16")
    assert kernels.rms_norm(x, paddle.ones([8], dtype="bfloat16"), 1e-5) is None
    assert kernels.swiglu(x, x) is None and kernels.token_log_probs(x, paddle.zeros([2], "int64")) is None
    assert kernels.rms_norm(paddle.ones([2, 8]), paddle.ones([8]), 1e-5) is not None
    scores, mask = paddle.ones([2, 3, 4]), paddle.zeros([2, 3, 4])
    assert kernels.attention_softmax(scores, mask) is not None
    assert kernels.attention_softmax(scores, mask[:, :1]) is None  # another shape
    learned = _leaf(np.zeros([2, 3, 4], "float32"))
    assert kernels.attention_softmax(scores, learned) is None  # a bias that takes a gradient: the composition
    assert RMSNorm(8, 1e-5)(x).shape == [2, 8]  # the composition


def test_a_model_step_with_the_kernels_equals_the_composition(lib, monkeypatch):
    config = LlamaConfig(vocab_size=211, hidden_size=48, intermediate_size=80, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, initializer_range=0.3)
    ids = paddle.to_tensor(np.random.default_rng(6).integers(0, 211, [2, 9]))
    out = {}
    for setting in ("off", "on"):
        monkeypatch.setenv("ALIGNMENT_CPU_KERNELS", setting)
        paddle.seed(11)
        model = LlamaForCausalLM(config)
        hidden = model(ids).hidden_states[:, :-1]  # [b, s-1, hidden]
        log_probs, entropy = model.token_log_probs(hidden, ids[:, 1:], with_entropy=True)
        log_probs.sum().backward()
        out[setting] = [log_probs.numpy(), entropy.numpy(), model.model.layers[0].mlp.gate_proj.weight.grad.numpy(),
                        model.model.norm.weight.grad.numpy()]
    for ours, theirs in zip(out["on"], out["off"]):
        np.testing.assert_allclose(ours, theirs, atol=1e-5 * max(1.0, np.abs(theirs).max()), rtol=1e-4)


def test_ranks_run_only_the_kernels_every_rank_took(lib, monkeypatch):
    monkeypatch.setenv("ALIGNMENT_CPU_KERNELS", "on")
    seen = []

    def other_rank_lacks_rms_norm(mine):  # the element-wise minimum with a rank that chose [1, 0, 1, 1, 1, ...]
        seen.append(list(mine))
        return [min(a, b) for a, b in zip(mine, [1, 0, 1, 1, 1, 1, 1, 1])]

    kernels.forget_choice()
    try:
        agreed = kernels.agree(other_rank_lacks_rms_norm)
        assert seen == [[1, 1, 1, 1, 1, 1, 1, 1]]
        assert list(kernels.REPLACES) == ["token_log_probs", "rms_norm", "swiglu", "attention_softmax", "rope",
                                          "decode_matmul", "decode_attention", "decode_layer"]
        assert agreed == {"token_log_probs": True, "rms_norm": False, "swiglu": True, "attention_softmax": True,
                          "rope": True, "decode_matmul": True, "decode_attention": True, "decode_layer": True}
        x = paddle.ones([2, 8])
        assert kernels.rms_norm(x, paddle.ones([8]), 1e-5) is None and kernels.swiglu(x, x) is not None
        monkeypatch.setenv("ALIGNMENT_CPU_KERNELS", "off")  # the agreement holds for the rest of the job
        assert kernels.swiglu(x, x) is not None
    finally:
        kernels.forget_choice()


FALLBACK = """
import json, sys
import paddle
from alignment.models.logprobs import gather_log_probs
from alignment import cpu_kernels as kernels
logits = paddle.to_tensor([[[0.0, 1.0, 2.0]]])
print(json.dumps([float(gather_log_probs(logits, paddle.to_tensor([[2]]))[0, 0]), kernels.chosen("swiglu")]))
"""


def test_without_a_compiler_paddle_runs_and_one_line_says_why(tmp_path):
    env = {**os.environ, "PYTHONPATH": REPO, "CXX": str(tmp_path / "no-such-compiler"),
           "ALIGNMENT_CPU_KERNELS": "on", "ALIGNMENT_CACHE_DIR": str(tmp_path / "cache")}
    done = subprocess.run([sys.executable, "-c", FALLBACK], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    value, chosen = json.loads(done.stdout.strip().splitlines()[-1])
    assert abs(value - (2.0 - np.log(1 + np.e + np.e ** 2))) < 1e-5 and chosen is False
    notes = [line for line in done.stdout.splitlines() if line.startswith("cpu kernels:")]  # stderr: errors only
    assert notes == [f"cpu kernels: not built (no C++ compiler ({tmp_path / 'no-such-compiler'} not found)); "
                     "Paddle's operations instead"]
    assert not (tmp_path / "cache" / "kernels").exists()


def test_a_bad_setting_is_refused_in_one_line(monkeypatch):
    monkeypatch.setenv("ALIGNMENT_CPU_KERNELS", "fast")
    with pytest.raises(ValueError, match="^ALIGNMENT_CPU_KERNELS must be one of auto, on, off, got 'fast'$"):
        kernels.swiglu(paddle.ones([2]), paddle.ones([2]))


def test_the_benchmark_times_kernels_that_compute_what_paddle_and_torch_do(lib):
    torch = pytest.importorskip("torch")
    from benchmarks import bench_cpu_ops

    calls = {}
    ops = bench_cpu_ops.operations(paddle, torch, calls)
    assert len(calls) == 11
    for name, kernel in calls.items():
        _, ours, theirs = ops[name]
        want = theirs().detach().numpy()
        for fn in (ours, kernel):  # one at a time: a backward call returns the input's gradient, reused next call
            got = fn().numpy()
            np.testing.assert_allclose(got.reshape(want.shape), want, rtol=2e-4, atol=2e-3, err_msg=name)
