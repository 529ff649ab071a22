"""Fused decode steps (alignment/models/fused_decode.py) give the layer path's tokens and log-probs bit for bit
(a tied head: its tokens, and log-probs to float rounding) where both run Paddle's operations. The decode kernels
(cpu_kernels' decode_matmul and decode_attention) round differently; tests/cpu_kernels/test_decode_*.py check that
path."""
import numpy as np
import paddle
import pytest

from alignment.models import GenerationConfig, generate
from alignment.models.fused_decode import fusable
from alignment.models.generation import SampleRows, prompt_rows
from tests.models.test_model import left_padded_batch, tiny_model


def assert_same_bits(fused, layers, rounding: bool = False):
    np.testing.assert_array_equal(fused.sequences.numpy(), layers.sequences.numpy())
    np.testing.assert_array_equal(fused.response_mask.numpy(), layers.response_mask.numpy())
    if rounding:  # a tied head below 16 rows: MKL's transposed-B kernel against the copy's plain one
        np.testing.assert_allclose(fused.log_probs.numpy(), layers.log_probs.numpy(), rtol=0, atol=1e-5)
    else:
        np.testing.assert_array_equal(fused.log_probs.numpy(), layers.log_probs.numpy())


@pytest.mark.parametrize("shape", [dict(), dict(num_key_value_heads=4), dict(num_key_value_heads=1),
                                   dict(tie_word_embeddings=True)],
                         ids=["grouped", "no-groups", "one-kv-head", "tied"])
def test_greedy_tokens_and_log_probs_equal_the_layer_path(shape, paddles_operations):
    model = tiny_model(**shape)
    assert fusable(model)
    ids, mask = left_padded_batch()
    config = GenerationConfig(max_new_tokens=12, do_sample=False, eos_token_id=None)
    layers = generate(model, ids, mask, config, log_prob_temperature=1.0, fused=False)
    fused = generate(model, ids, mask, config, log_prob_temperature=1.0)
    assert_same_bits(fused, layers, rounding=model.config.tie_word_embeddings)
    assert len(set(layers.sequences.numpy()[:, 6:].ravel().tolist())) > 3  # a real continuation


def test_head_slices_are_the_head_as_hidden_by_vocab_copies():
    from alignment.models.fused_decode import vocab_slices

    embedding = paddle.randn([11, 4])  # [vocab, hidden]
    for weight, axis in ((embedding, 0), (paddle.assign(embedding.t()), 1)):
        parts = vocab_slices(weight, axis, 4)
        assert [p.shape for p in parts] == [[4, 3], [4, 3], [4, 3], [4, 2]]
        np.testing.assert_array_equal(paddle.concat(parts, axis=1).numpy(), embedding.numpy().T)
        parts[0][0, 0] = 100.0  # copies: the model's weight is untouched
        assert float(weight.reshape([-1]).max()) < 100.0
    assert len(vocab_slices(embedding, 0, 32)) == 11


def test_head_slice_count_keeps_slices_near_their_column_width():
    from alignment.models.fused_decode import HEAD_SLICE_COLUMNS, head_slice_count

    assert head_slice_count(49152) == 8  # SmolLM2: the 8 slices measured fastest
    assert head_slice_count(8000) == head_slice_count(1) == 1
    assert head_slice_count(32000) == 5 and head_slice_count(5 * HEAD_SLICE_COLUMNS) == 5


@pytest.mark.parametrize("tied", [False, True])
def test_step_logits_are_the_same_bits_however_the_head_is_sliced(tied):
    from alignment.models.fused_decode import FusedDecoder, vocab_slices
    from alignment.models.slot_cache import SlotCache

    model = tiny_model(tie_word_embeddings=tied)
    ids, mask = left_padded_batch()
    b = ids.shape[0]
    token = paddle.to_tensor(np.arange(b) % model.config.vocab_size)
    head = model.model.embed_tokens.weight if tied else model.lm_head.weight
    logits = []
    for count in (1, 3, 7):
        with paddle.no_grad():
            cache = SlotCache.for_model(model, b, 16)
            for slot, row in enumerate(prompt_rows(ids, mask)):
                out = model(paddle.to_tensor([row]), use_cache=True)
                cache.write(slot, out.past_key_values, 0)
            decoder = FusedDecoder(model, b)
            decoder.head_slices = vocab_slices(head, 0 if tied else 1, count)
            logits.append(decoder.step(token, cache, *cache.step_inputs(np.ones([b], bool))).numpy())
    assert logits[0].shape == (b, model.config.vocab_size)
    np.testing.assert_array_equal(logits[1], logits[0])
    np.testing.assert_array_equal(logits[2], logits[0])


def test_rotary_rows_are_step_rotary_of_the_positions_across_table_rebuilds():
    from alignment.models.fused_decode import FusedDecoder, step_rotary

    model = tiny_model()
    decoder = FusedDecoder(model, 3)
    attn = model.model.layers[0].self_attn
    widths = []
    for width in (7, 9, 14, 15, 30):  # the first table (twice 7) is rebuilt once, for 15
        positions = paddle.to_tensor(np.random.default_rng(width).integers(0, width, 3))
        cos, sin = decoder.rotary_rows(positions, width)
        ref_cos, ref_sin = step_rotary(positions.reshape([-1, 1]), attn.head_dim, model.config.rope,
                                       attn.num_heads, attn.num_kv_heads)
        np.testing.assert_array_equal(cos.numpy(), ref_cos.numpy())
        np.testing.assert_array_equal(sin.numpy(), ref_sin.numpy())
        widths.append(decoder.rotary[0].shape[0])
    assert widths == [14, 14, 14, 30, 30]


def test_sampling_with_a_seed_equals_the_layer_path_with_eos_penalty_and_row_numbers(paddles_operations):
    model = tiny_model()
    ids, mask = left_padded_batch()
    free = generate(model, ids, mask, GenerationConfig(max_new_tokens=8, do_sample=False)).sequences.numpy()
    config = GenerationConfig(max_new_tokens=10, temperature=0.8, top_k=20, top_p=0.9, repetition_penalty=1.3,
                              min_new_tokens=2, eos_token_id=[int(free[0, 8])])
    rows = SampleRows(paddle.to_tensor([0, 1, 2]), 3)
    for row_numbers in (None, rows):
        paddle.seed(3)
        layers = generate(model, ids, mask, config, rows=row_numbers, log_prob_temperature=0.8, fused=False)
        paddle.seed(3)
        assert_same_bits(generate(model, ids, mask, config, rows=row_numbers, log_prob_temperature=0.8), layers)


def test_lora_tensor_parallel_or_biased_models_decode_through_their_layers():
    from alignment.models.lora import apply_lora

    model = tiny_model()
    apply_lora(model, rank=2)
    assert not fusable(model)
    assert not fusable(tiny_model(model_type="qwen2"))  # q/k/v biases
    split = tiny_model()
    split.config.tensor_parallel_degree = 2  # what fusable reads; building a split model needs fleet
    assert not fusable(split)
    ids, mask = left_padded_batch()
    out = generate(model, ids, mask, GenerationConfig(max_new_tokens=4, do_sample=False))
    assert out.sequences.shape == [3, 10]
