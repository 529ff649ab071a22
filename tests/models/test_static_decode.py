"""The static-graph decode step gives the same tokens as eager KV-cache decoding."""
import numpy as np
import paddle

from alignment.models import GenerationConfig, LlamaForCausalLM, generate
from alignment.models.static_decode import StaticDecoder


def left_padded(rows, pad=0):
    width = max(len(r) for r in rows)
    ids = np.full((len(rows), width), pad, dtype="int64")
    mask = np.zeros((len(rows), width), dtype="int64")
    for i, row in enumerate(rows):
        ids[i, width - len(row):] = row
        mask[i, width - len(row):] = 1
    return paddle.to_tensor(ids), paddle.to_tensor(mask)


def test_static_greedy_tokens_equal_eager_with_left_padding_and_eos(tiny_model_dir):
    model = LlamaForCausalLM.from_pretrained(tiny_model_dir)
    ids, mask = left_padded([[5, 6, 7, 8, 9, 10, 11], [12, 13], [14, 15, 16, 17]])
    decoder = StaticDecoder(model)
    for eos in (None, 3):
        config = GenerationConfig(max_new_tokens=20, do_sample=False, eos_token_id=eos)
        eager = generate(model, ids, mask, config)
        static = generate(model, ids, mask, config, static=decoder)
        np.testing.assert_array_equal(static.sequences.numpy(), eager.sequences.numpy())
        np.testing.assert_array_equal(static.response_mask.numpy(), eager.response_mask.numpy())
    assert len(decoder._compiled) == 1  # one program for this (batch, cache width), reused


def test_static_sampling_draws_from_the_same_distribution(tiny_model_dir):
    """Same seed, same logits: sampled tokens match eager sampling step for step."""
    model = LlamaForCausalLM.from_pretrained(tiny_model_dir)
    ids, mask = left_padded([[5, 6, 7], [8, 9, 10]])
    config = GenerationConfig(max_new_tokens=12, do_sample=True, temperature=0.8, top_p=0.9)
    paddle.seed(3)
    eager = generate(model, ids, mask, config)
    paddle.seed(3)
    static = generate(model, ids, mask, config, static=StaticDecoder(model))
    np.testing.assert_array_equal(static.sequences.numpy(), eager.sequences.numpy())


def test_static_greedy_equals_eager_and_no_cache_with_grouped_query_attention_and_tied_embeddings():
    """kv_heads < heads (the cache holds 2 heads, attention repeats them) and a tied LM head, in one program."""
    from alignment.models import LlamaConfig, generate_without_cache

    paddle.seed(11)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=97, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                         num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True,
                                         initializer_range=0.3))
    model.eval()
    ids, mask = left_padded([[5, 6, 7, 8], [9, 10], [11, 12, 13]])
    config = GenerationConfig(max_new_tokens=10, do_sample=False, eos_token_id=None)
    eager = generate(model, ids, mask, config).sequences.numpy()
    np.testing.assert_array_equal(generate(model, ids, mask, config, static=StaticDecoder(model)).sequences.numpy(),
                                  eager)
    np.testing.assert_array_equal(generate_without_cache(model, ids, mask, config).sequences.numpy(), eager)
    assert len(set(eager[:, 4:].ravel().tolist())) > 3  # a real continuation, not one repeated token
