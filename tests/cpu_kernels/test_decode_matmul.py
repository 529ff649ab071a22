"""The decode GEMM kernel (alignment/cpu_kernels/csrc/decode_matmul.cc) and the fused decoder over its panels and
the decode attention kernel: values against float64, the panel layout, the same bits at any batch size and thread
count, and greedy decoding that keeps the layer path's tokens. Skipped where no library can be built (no C++
compiler)."""
import numpy as np
import paddle
import pytest

from alignment import cpu_kernels as kernels
from alignment.models import GenerationConfig, generate
from alignment.models.fused_decode import FusedDecoder, Panels, matmul
from tests.models.test_model import left_padded_batch, tiny_model


@pytest.fixture
def kernels_on(lib, monkeypatch):
    monkeypatch.setenv("ALIGNMENT_CPU_KERNELS", "on")
    kernels.forget_choice()
    yield lib
    kernels.forget_choice()


def test_panels_hold_the_columns_in_blocks_of_32_padded_with_zeros(lib):
    w = np.arange(3 * 40, dtype="float32").reshape([3, 40])  # [K, N]
    packed = lib.alignment_pack_panels(paddle.to_tensor(w), False, 2).numpy()
    assert packed.shape == (2, 3, 32)  # ceil(40 / 32) panels of [K, 32]
    np.testing.assert_array_equal(packed[0], w[:, :32])
    np.testing.assert_array_equal(packed[1, :, :8], w[:, 32:])
    assert (packed[1, :, 8:] == 0).all()
    transposed = lib.alignment_pack_panels(paddle.to_tensor(np.ascontiguousarray(w.T)), True, 1).numpy()
    np.testing.assert_array_equal(transposed, packed)  # an embedding [N, K] packs as its transpose


@pytest.mark.parametrize("rows", [1, 5, 6, 7, 8, 13, 24])
@pytest.mark.parametrize("n", [75, 90])  # a last panel of 11 columns (under half of it), of 26 (over half)
def test_products_equal_float64_for_any_row_count(lib, rows, n):
    rng = np.random.default_rng(rows)
    w = rng.standard_normal([200, n]).astype("float32")  # K 200: a partial last panel
    x = rng.standard_normal([rows, 1, 200]).astype("float32")
    packed = lib.alignment_pack_panels(paddle.to_tensor(w), False, 2)
    y = lib.alignment_panel_matmul(paddle.to_tensor(x), packed, n, 2).numpy()
    assert y.shape == (rows, 1, n)
    exact = x.astype("float64") @ w.astype("float64")
    np.testing.assert_allclose(y, exact, rtol=0, atol=2e-5 * np.abs(exact).max())


def test_a_row_has_the_same_bits_alone_in_any_batch_and_on_any_thread_count(lib):
    rng = np.random.default_rng(3)
    w = paddle.to_tensor(rng.standard_normal([576, 1536]).astype("float32"))  # enough panels for 2 threads
    x = paddle.to_tensor(rng.standard_normal([19, 576]).astype("float32"))
    packed = lib.alignment_pack_panels(w, False, 2)
    full = [lib.alignment_panel_matmul(x, packed, 1536, t).numpy() for t in (1, 2)]
    np.testing.assert_array_equal(full[0], full[1])
    for lo, hi in ((4, 5), (8, 16), (0, 3)):  # alone, in a full group of 8, in a partial one
        np.testing.assert_array_equal(lib.alignment_panel_matmul(x[lo:hi], packed, 1536, 2).numpy(), full[0][lo:hi])


def test_the_function_packs_float32_matrices_only_where_the_kernel_runs(kernels_on, monkeypatch):
    w = paddle.ones([6, 40])
    assert kernels.pack_panels(w.astype("bfloat16")) is None and kernels.pack_panels(paddle.ones([2, 6, 40])) is None
    packed = kernels.pack_panels(w)
    assert packed.shape == [2, 6, 32] and packed.stop_gradient
    np.testing.assert_array_equal(kernels.panel_matmul(paddle.ones([3, 6]), packed, 40).numpy(), np.full([3, 40], 6))
    monkeypatch.setenv("ALIGNMENT_CPU_KERNELS", "off")
    kernels.forget_choice()
    assert kernels.pack_panels(w) is None


def test_the_gemm_kernels_panels_are_made_only_when_the_weights_exceed_the_last_level_cache(lib, monkeypatch):
    """The decode GEMM kernel without the layer kernel packs every projection and the LM head only for a model
    larger than the cache; with the layer kernel too the layers are packed at any size, the head still only then."""
    from alignment.models import fused_decode

    model = tiny_model()
    assert not model.config.tie_word_embeddings  # the untied embedding is only indexed: not streamed
    streamed = 4 * (sum(int(p.size) for p in model.model.layers.parameters()) + int(model.lm_head.weight.size))
    monkeypatch.setenv("ALIGNMENT_CPU_KERNELS", "auto")
    kernels.forget_choice()
    try:
        for layer_kernel in (False, True):
            kernels._chosen.update({name: layer_kernel or name != "decode_layer" for name in kernels.REPLACES})
            for cache, packed in ((streamed, False), (streamed - 1, True), (0, True)):  # 0: sysfs did not say
                monkeypatch.setattr(fused_decode, "last_level_cache_bytes", lambda: cache)
                assert fused_decode.streams_from_memory(model) is packed
                decoder = FusedDecoder(model, 2)
                assert isinstance(decoder.layers[0].o, Panels) is (packed or layer_kernel)
                assert isinstance(decoder.head_slices[0], Panels) is packed
        assert not isinstance(FusedDecoder(model, 2, packed=False).head_slices[0], Panels)
    finally:
        kernels.forget_choice()


@pytest.mark.parametrize("tied", [False, True])
def test_the_fused_decoder_over_the_decode_kernels_keeps_the_layer_paths_tokens(kernels_on, tied, monkeypatch):
    from alignment.models import fused_decode

    monkeypatch.setattr(fused_decode, "last_level_cache_bytes", lambda: 0)  # as for a model larger than the cache
    model = tiny_model(tie_word_embeddings=tied)
    decoder = FusedDecoder(model, 3)
    assert decoder.attention_kernel  # decode_attention too
    projections = [w for layer in decoder.layers for w in (layer.qkv, layer.o, layer.gate, layer.up, layer.down)]
    assert all(isinstance(w, Panels) for w in projections + decoder.head_slices)
    assert len(decoder.head_slices) == 1 and decoder.head_slices[0].n == model.config.vocab_size
    hidden = paddle.randn([3, 1, model.config.hidden_size])
    head = model.model.embed_tokens.weight.t() if tied else model.lm_head.weight
    np.testing.assert_allclose(matmul(hidden, decoder.head_slices[0]).numpy(), paddle.matmul(hidden, head).numpy(),
                               rtol=0, atol=1e-5)
    ids, mask = left_padded_batch()
    config = GenerationConfig(max_new_tokens=12, do_sample=False, eos_token_id=None)
    layers = generate(model, ids, mask, config, log_prob_temperature=1.0, fused=False)
    fused = generate(model, ids, mask, config, log_prob_temperature=1.0)
    np.testing.assert_array_equal(fused.sequences.numpy(), layers.sequences.numpy())
    np.testing.assert_allclose(fused.log_probs.numpy(), layers.log_probs.numpy(), rtol=0, atol=1e-5)


def test_the_next_decoder_of_a_model_packs_into_the_same_panels_with_the_new_weights(kernels_on, monkeypatch):
    """A generate call per RL step: the panels are written in place (the heap does not fragment), and carry the
    weights the model has when the decoder is made."""
    from alignment.models import fused_decode

    monkeypatch.setattr(fused_decode, "last_level_cache_bytes", lambda: 0)
    model = tiny_model()
    first = FusedDecoder(model, 2)
    kept = first.layers[0].o.packed
    x = paddle.to_tensor(np.random.default_rng(4).standard_normal([3, model.config.hidden_size]).astype("float32"))
    o_proj = model.model.layers[0].self_attn.o_proj.weight
    with paddle.no_grad():
        o_proj.set_value(o_proj * 2.0)
    second = FusedDecoder(model, 5)
    assert second.layers[0].o.packed is kept and second.head_slices[0].packed is first.head_slices[0].packed
    np.testing.assert_allclose(matmul(x, second.layers[0].o).numpy(), (x @ o_proj).numpy(), rtol=1e-5, atol=1e-5)
    other = FusedDecoder(tiny_model(), 2)  # another model: panels of its own
    assert other.layers[0].o.packed is not kept
