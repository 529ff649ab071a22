"""The decode attention kernel (alignment/cpu_kernels/csrc/decode_attention.cc): RoPE, the cache writes and the
attention of one new token per row against float64, both RoPE layouts and grouped heads, masked and all-masked
rows, the same bits at any cache width and thread count, and the errors it raises. Skipped where no library can be
built (no C++ compiler)."""
import numpy as np
import paddle
import pytest

from alignment import cpu_kernels as kernels
from alignment.models.rope import rotate_half_matrix

MASK = -1e9


def inputs(seed, b=3, heads=4, kv=2, d=8, width=10):
    rng = np.random.default_rng(seed)
    qkv, cos, sin = (rng.standard_normal([b, heads + 2 * kv, d]).astype("float32") for _ in range(3))
    k_cache, v_cache = (rng.standard_normal([b, kv, width, d]).astype("float32") for _ in range(2))
    return qkv, cos, sin, k_cache, v_cache


def reference(qkv, cos, sin, k_cache, v_cache, column, bias, heads, interleaved):
    """float64: the caches after the writes and the output [b, 1, heads d]."""
    b, fused, d = qkv.shape
    kv = (fused - heads) // 2
    rotate = rotate_half_matrix(d, "float32", interleaved).numpy().astype("float64")
    roped = qkv.astype("float64") * cos + (qkv.astype("float64") @ rotate) * sin  # [b, fused, d]
    k, v = k_cache.astype("float64"), v_cache.astype("float64")
    for r in range(b):
        k[r, :, column[r]] = roped[r, heads: heads + kv]
        v[r, :, column[r]] = qkv[r, heads + kv:]  # v passes through
    out = np.zeros([b, heads, d])
    for r in range(b):
        for h in range(heads):
            g = h // (heads // kv)
            scores = k[r, g] @ roped[r, h] + bias[r]  # [width]
            p = np.exp(scores - scores.max())
            out[r, h] = (p / p.sum()) @ v[r, g]
    return k, v, out.reshape([b, 1, heads * d])


def run(lib, arrays, column, bias, heads, interleaved=False, threads=2):
    qkv, cos, sin, k_cache, v_cache = (paddle.to_tensor(a) for a in arrays)
    out = lib.alignment_decode_attention(qkv, cos, sin, k_cache, v_cache, paddle.to_tensor(column, dtype="int64"),
                                         paddle.to_tensor(bias), heads, interleaved, threads)[0]
    return k_cache.numpy(), v_cache.numpy(), out.numpy()


@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("heads, kv", [(4, 2), (4, 4), (4, 1)], ids=["grouped", "no-groups", "one-kv-head"])
def test_writes_and_output_equal_float64(lib, interleaved, heads, kv):
    arrays = inputs(1, heads=heads, kv=kv)
    column = np.array([3, 9, 0])
    bias = np.zeros([3, 10], "float32")
    bias[0, 5:] = MASK  # row 0 attends to columns 0-4 only
    bias[2, ::2] = MASK  # row 2 to the odd ones and not to the column it writes
    got = run(lib, arrays, column, bias, heads, interleaved)
    want = reference(*arrays, column, bias, heads, interleaved)
    for ours, exact in zip(got, want):
        np.testing.assert_allclose(ours, exact, rtol=0, atol=2e-5 * max(1.0, np.abs(exact).max()))


def test_a_row_whose_columns_are_all_masked_averages_them_as_paddles_softmax(lib):
    arrays = inputs(2, b=1)
    bias = np.full([1, 10], MASK, "float32")
    k, v, out = run(lib, arrays, np.array([4]), bias, 4)
    np.testing.assert_allclose(out.reshape([4, 8])[0], v[0, 0].mean(0), rtol=0, atol=1e-5)  # uniform weights


def test_a_rows_bits_do_not_depend_on_the_cache_width_the_other_rows_or_the_threads(lib):
    qkv, cos, sin, k_cache, v_cache = inputs(3, b=3, width=70)
    k_cache[:, :, 40:] = v_cache[:, :, 40:] = 0.0  # unwritten columns hold zeros (slot_cache.py)
    bias = np.where(np.arange(70) < 30, 0.0, MASK).astype("float32")[None].repeat(3, 0)  # [3, 70]
    column = np.array([29, 29, 29])
    wide = run(lib, (qkv, cos, sin, k_cache, v_cache), column, bias, 4, threads=2)[2]
    narrow = run(lib, (qkv, cos, sin, k_cache[:, :, :40].copy(), v_cache[:, :, :40].copy()), column,
                 bias[:, :40].copy(), 4, threads=1)[2]
    alone = run(lib, (qkv[1:2], cos[1:2], sin[1:2], k_cache[1:2], v_cache[1:2]), column[1:2], bias[1:2], 4)[2]
    np.testing.assert_array_equal(wide, narrow)
    np.testing.assert_array_equal(alone[0], wide[1])


def test_bad_inputs_raise_and_the_function_takes_float32_only(lib, monkeypatch):
    arrays = inputs(4)
    with pytest.raises(Exception, match="outside the cache"):
        run(lib, arrays, np.array([3, 10, 0]), np.zeros([3, 10], "float32"), 4)
    with pytest.raises(Exception, match="multiple of kv_heads"):
        run(lib, arrays, np.array([3, 1, 0]), np.zeros([3, 10], "float32"), 3)
    monkeypatch.setenv("ALIGNMENT_CPU_KERNELS", "on")
    kernels.forget_choice()
    try:
        tensors = [paddle.to_tensor(a) for a in arrays]
        column, bias = paddle.to_tensor([3, 1, 0]), paddle.zeros([3, 10])
        assert kernels.decode_attention(*tensors, column, bias, 4, False).shape == [3, 1, 32]
        half = [t.astype("float16") for t in tensors]
        assert kernels.decode_attention(*half, column, bias, 4, False) is None
    finally:
        kernels.forget_choice()
