"""The decode_layer kernel (csrc/decode_layer.cc): a decoder layer of a decode step in one call gives the bits of
the separate kernels called one by one (fused_decode.py's `_kernel_layer`), on any thread count, and refuses
weights that are not packed."""
import numpy as np
import paddle
import pytest

from alignment import cpu_kernels as kernels
from alignment.cpu_kernels.choice import DECODE_ROWS
from alignment.models import fused_decode
from alignment.models.fused_decode import FusedDecoder
from tests.models.test_model import tiny_model

# per layer 195k weight floats: two threads share a layer (decode_layer.cc's team: one per 32k floats)
WIDE = dict(hidden_size=128, intermediate_size=384, num_attention_heads=4, num_key_value_heads=2)


@pytest.fixture
def packed_kernels(lib, monkeypatch):
    """Every kernel on, and the weights packed (as for a model larger than the last-level cache)."""
    monkeypatch.setenv("ALIGNMENT_CPU_KERNELS", "on")
    monkeypatch.setattr(fused_decode, "last_level_cache_bytes", lambda: 0)
    kernels.forget_choice()
    yield
    kernels.forget_choice()


def step(decoder, caches, width: int, batch: int):
    """Three decode steps of `decoder` over copies of `caches` -> (logits of each step, the caches after)."""
    class Cache:
        k = [paddle.assign(t) for t in caches[0]]
        v = [paddle.assign(t) for t in caches[1]]
    Cache.width = width
    rng = np.random.default_rng(3)
    mask = paddle.to_tensor((rng.random([batch, width]) < 0.7).astype("int64"))
    logits = []
    for position in (5, 6, 7):
        token = paddle.to_tensor(rng.integers(0, 97, batch))
        column = paddle.to_tensor(np.full([batch], position, "int64"))
        with paddle.no_grad():
            logits.append(decoder.step(token, Cache, column, mask, paddle.full([batch, 1], position, "int64")).numpy())
    return logits, [t.numpy() for t in Cache.k + Cache.v]


@pytest.mark.parametrize("model_type", ["llama", "ernie4_5"])  # half and interleaved RoPE
def test_a_layer_in_one_call_gives_the_bits_of_the_kernels_one_by_one_on_any_thread_count(
        packed_kernels, model_type, monkeypatch):
    batch, width = 3, 12
    model = tiny_model(model_type=model_type, **WIDE)
    decoder = FusedDecoder(model, batch)
    assert len(decoder.kernel_layers) == model.config.num_hidden_layers
    d = decoder.head_dim
    rng = np.random.default_rng(0)
    caches = [[paddle.to_tensor(rng.standard_normal([batch, decoder.kv_heads, width, d]).astype("float32"))
               for _ in decoder.layers] for _ in range(2)]
    fused, fused_caches = step(decoder, caches, width, batch)
    monkeypatch.setattr(kernels, "threads", lambda: 1)
    one_thread, one_thread_caches = step(decoder, caches, width, batch)
    decoder.kernel_layers = []  # the kernels one by one (_kernel_layer)
    separate, separate_caches = step(decoder, caches, width, batch)
    for got, thread, want in zip(fused + fused_caches, one_thread + one_thread_caches, separate + separate_caches):
        np.testing.assert_array_equal(got, want)
        np.testing.assert_array_equal(thread, want)
    assert not np.array_equal(fused_caches[0], caches[0][0].numpy())  # the steps wrote the caches


def test_weights_that_are_not_packed_and_columns_outside_the_cache_raise(packed_kernels):
    model = tiny_model(**WIDE)
    decoder = FusedDecoder(model, 2)
    input_norm, post_norm, packed = decoder.kernel_layers[0]
    x, cos, sin = paddle.randn([2, 1, 128]), *decoder.rotary_rows(paddle.to_tensor([1, 2]), 8)
    caches = [paddle.zeros([2, 2, 8, 32]) for _ in range(2)]
    bias, column = paddle.zeros([2, 8]), paddle.to_tensor([1, 2])
    out = kernels.decode_layer(x, cos, sin, *caches, column, bias, input_norm, post_norm, packed, 4, False, 1e-6)
    assert out.shape == [2, 1, 128]
    plain = (model.model.layers[0].self_attn.q_proj.weight,) + packed[1:]
    with pytest.raises(Exception, match="qkv must be the panels"):
        kernels.decode_layer(x, cos, sin, *caches, column, bias, input_norm, post_norm, plain, 4, False, 1e-6)
    with pytest.raises(Exception, match="outside the cache"):
        kernels.decode_layer(x, cos, sin, *caches, paddle.to_tensor([1, 8]), bias, input_norm, post_norm, packed, 4,
                             False, 1e-6)


def test_the_layer_kernel_alone_packs_the_layers_and_keeps_mkls_lm_head(lib, monkeypatch):
    """Chosen where the decode GEMM alone is not (an AMD EPYC Zen 3: MKL wins one [576, 1536] GEMM, loses a layer):
    at any width, and for a model in the cache too, the layers' weights go into panels and each layer is one call,
    the LM head stays MKL's slices; the logits are the bits of the decoder with every kernel on and the same head.
    Explicitly unpacked (packed=False), nothing is packed."""
    cache = {"bytes": 0}
    monkeypatch.setattr(fused_decode, "last_level_cache_bytes", lambda: cache["bytes"])
    monkeypatch.setenv("ALIGNMENT_CPU_KERNELS", "auto")
    model, batch, width = tiny_model(**WIDE), 2, 10
    kernels.forget_choice()
    try:
        kernels._chosen.update({name: name == "decode_layer" for name in kernels.REPLACES})
        alone = FusedDecoder(model, batch)
        assert not kernels.chosen("decode_matmul") and not kernels.chosen("decode_attention")
        assert len(alone.kernel_layers) == model.config.num_hidden_layers
        assert all(not isinstance(part, fused_decode.Panels) for part in alone.head_slices)
        wide = FusedDecoder(model, 4 * DECODE_ROWS)  # an RL rollout's width: the layer kernel still
        assert len(wide.kernel_layers) == model.config.num_hidden_layers
        cache["bytes"] = 1 << 40  # the model fits in the cache
        assert not fused_decode.streams_from_memory(model)
        resident = FusedDecoder(model, batch)
        assert len(resident.kernel_layers) == model.config.num_hidden_layers
        assert all(not isinstance(part, fused_decode.Panels) for part in resident.head_slices)
        unpacked = FusedDecoder(model, batch, packed=False)
        assert unpacked.kernel_layers == [] and not isinstance(unpacked.layers[0].qkv, fused_decode.Panels)
        cache["bytes"] = 0
        kernels._chosen.update({name: name != "decode_layer" for name in kernels.REPLACES})
        both = FusedDecoder(model, DECODE_ROWS + 1)  # both decode kernels: the panels are there, a layer is one call
        assert len(both.kernel_layers) == model.config.num_hidden_layers
        kernels._chosen.update({name: True for name in kernels.REPLACES})
        every = FusedDecoder(model, batch)
        assert isinstance(every.head_slices[0], fused_decode.Panels)
        every.head_slices = alone.head_slices
        rng = np.random.default_rng(1)
        caches = [[paddle.to_tensor(rng.standard_normal([batch, alone.kv_heads, width, alone.head_dim]).astype(
            "float32")) for _ in alone.layers] for _ in range(2)]
        kernels._chosen.update({name: name == "decode_layer" for name in kernels.REPLACES})
        got, got_caches = step(alone, caches, width, batch)
        want, want_caches = step(every, caches, width, batch)
    finally:
        kernels.forget_choice()
    for a, b in zip(got + got_caches, want + want_caches):
        np.testing.assert_array_equal(a, b)
