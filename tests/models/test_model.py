import json
import os

import numpy as np
import paddle
import pytest

from alignment.models import GenerationConfig, LlamaConfig, LlamaForCausalLM, generate, generate_without_cache
from alignment.models.sampling import apply_repetition_penalty, apply_top_k, apply_top_p

TINY = dict(vocab_size=97, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, initializer_range=0.3)


def tiny_model(**overrides):
    paddle.seed(7)
    model = LlamaForCausalLM(LlamaConfig(**{**TINY, **overrides}))
    model.eval()
    return model


def left_padded_batch():
    ids = paddle.to_tensor([[0, 0, 0, 5, 9, 11], [4, 8, 15, 16, 23, 42], [0, 3, 1, 4, 1, 5]])
    mask = paddle.to_tensor([[0, 0, 0, 1, 1, 1], [1, 1, 1, 1, 1, 1], [0, 1, 1, 1, 1, 1]])
    return ids, mask


def test_save_then_load_round_trips_exactly_in_hf_layout(tmp_path):
    model = tiny_model(model_type="qwen2")
    model.save_pretrained(str(tmp_path / "ckpt"))
    config = json.load(open(tmp_path / "ckpt" / "config.json"))
    for key in ("model_type", "hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
                "intermediate_size", "vocab_size", "rms_norm_eps", "rope_theta", "architectures"):
        assert key in config
    from safetensors import safe_open
    with safe_open(str(tmp_path / "ckpt" / "model.safetensors"), framework="numpy") as f:
        names = set(f.keys())
        assert f.get_tensor("model.layers.0.self_attn.q_proj.weight").shape == (32, 32)  # HF [out, in]
        assert f.get_tensor("model.layers.1.self_attn.k_proj.weight").shape == (16, 32)
        assert f.get_tensor("lm_head.weight").shape == (97, 32)
    assert "model.layers.1.mlp.gate_proj.weight" in names and "model.norm.weight" in names
    loaded = LlamaForCausalLM.from_pretrained(str(tmp_path / "ckpt"))
    for (name, a), (_, b) in zip(model.state_dict().items(), loaded.state_dict().items()):
        np.testing.assert_array_equal(a.numpy(), b.numpy(), err_msg=name)
    assert not [p for p in os.listdir(tmp_path) if ".tmp-" in p]


def test_sharded_save_writes_index_and_loads(tmp_path):
    model = tiny_model()
    model.save_pretrained(str(tmp_path / "ckpt"), max_shard_bytes=20_000)
    files = os.listdir(tmp_path / "ckpt")
    assert "model.safetensors.index.json" in files and len([f for f in files if f.endswith(".safetensors")]) > 2
    ids, mask = left_padded_batch()
    loaded = LlamaForCausalLM.from_pretrained(str(tmp_path / "ckpt"))
    np.testing.assert_array_equal(loaded(ids, mask).logits.numpy(), model(ids, mask).logits.numpy())


def test_config_mismatch_and_truncated_weights_give_clear_errors(tmp_path):
    model = tiny_model()
    path = str(tmp_path / "ckpt")
    model.save_pretrained(path)
    config = json.load(open(os.path.join(path, "config.json")))
    config["intermediate_size"] = 48
    json.dump(config, open(os.path.join(path, "config.json"), "w"))
    with pytest.raises(ValueError, match=r"model\.safetensors: tensor model\.layers\.0\.mlp\..*shape"):
        LlamaForCausalLM.from_pretrained(path)
    model.save_pretrained(path)
    weights = os.path.join(path, "model.safetensors")
    data = open(weights, "rb").read()
    open(weights, "wb").write(data[: len(data) // 2])
    with pytest.raises(ValueError, match="model.safetensors: cannot read safetensors file"):
        LlamaForCausalLM.from_pretrained(path)


def test_kv_cache_forward_equals_full_forward_with_left_padding():
    model = tiny_model()
    ids, mask = left_padded_batch()
    full = model(ids, mask).logits
    first = model(ids[:, :4], mask[:, :4], use_cache=True)
    second = model(ids[:, 4:], mask, past_key_values=first.past_key_values, use_cache=True)
    both = paddle.concat([first.logits, second.logits], axis=1)
    valid = mask.numpy().astype(bool)
    assert np.abs(both.numpy()[valid] - full.numpy()[valid]).max() < 1e-5


def test_left_padding_does_not_change_a_rows_logits():
    model = tiny_model()
    ids, mask = left_padded_batch()
    padded = model(ids, mask).logits[0, 3:]
    alone = model(ids[0:1, 3:]).logits[0]
    assert np.abs(padded.numpy() - alone.numpy()).max() < 1e-5


@pytest.mark.parametrize("penalty", [1.0, 1.3])
def test_kv_cache_greedy_generation_equals_recomputation(penalty):
    model = tiny_model()
    ids, mask = left_padded_batch()
    config = GenerationConfig(max_new_tokens=12, do_sample=False, repetition_penalty=penalty)
    cached = generate(model, ids, mask, config)
    recomputed = generate_without_cache(model, ids, mask, config)
    np.testing.assert_array_equal(cached.sequences.numpy(), recomputed.sequences.numpy())
    assert cached.sequences.shape == [3, 18]


@pytest.mark.parametrize("options", [dict(), dict(repetition_penalty=1.3, top_k=5, min_new_tokens=4),
                                     dict(eos_token_id=[0], pad_token_id=0)])
def test_sampled_log_probs_equal_a_whole_sequence_forward(options):
    """generate(log_prob_temperature=T): each drawn token's log softmax(logits / T) from the sampling pass itself
    equals the trainer's forward pass over prompt + response (left-padded rows, temperature 0.7; penalties, top-k
    and the min-length eos block change what is drawn, not the score; eos == pad pads finished rows)."""
    from alignment.ppo.rollout.rollout import response_log_probs

    model = tiny_model()
    ids, mask = left_padded_batch()
    paddle.seed(3)
    config = GenerationConfig(max_new_tokens=10, do_sample=True, temperature=0.7, **options)
    out = generate(model, ids, mask, config, log_prob_temperature=0.7)
    response_mask = out.response_mask
    full_mask = paddle.concat([mask, response_mask], axis=1)
    scored, _ = response_log_probs(model, out.sequences, full_mask, ids.shape[1], temperature=0.7)  # [3, R]
    assert out.log_probs.shape == scored.shape == response_mask.shape
    valid = response_mask.numpy().astype(bool)
    sampled = out.log_probs.numpy()
    assert (sampled[valid] < 0).all() and np.isfinite(sampled).all()
    np.testing.assert_allclose(sampled[valid], scored.numpy()[valid], rtol=1e-5, atol=1e-5)
    if "eos_token_id" in options:
        assert not valid.all()  # some row ended early: its padded tail is masked out
    assert generate(model, ids, mask, config).log_probs is None  # not asked: not computed


def test_eos_stops_rows_independently_and_pads_after():
    model = tiny_model()
    ids, mask = left_padded_batch()
    free = generate(model, ids, mask, GenerationConfig(max_new_tokens=8, do_sample=False)).sequences.numpy()
    eos = int(free[0, 6 + 2])  # row 0's third generated token becomes the eos
    out = generate(model, ids, mask, GenerationConfig(max_new_tokens=8, do_sample=False, eos_token_id=[eos],
                                                       pad_token_id=0))
    seq, resp_mask = out.sequences.numpy(), out.response_mask.numpy()
    first_eos = list(seq[0, 6:]).index(eos)
    assert first_eos <= 2
    assert (seq[0, 6 + first_eos + 1:] == 0).all()
    assert resp_mask[0].tolist() == [1] * (first_eos + 1) + [0] * (seq.shape[1] - 6 - first_eos - 1)
    for row in range(3):  # rows that never emit eos run to the end
        if eos not in seq[row, 6:]:
            assert resp_mask[row].all()


def test_sampling_is_reproducible_with_seed_and_respects_top_k_1():
    model = tiny_model()
    ids, mask = left_padded_batch()
    config = GenerationConfig(max_new_tokens=6, do_sample=True, temperature=0.7, top_p=0.9)
    paddle.seed(3)
    a = generate(model, ids, mask, config).sequences.numpy()
    paddle.seed(3)
    b = generate(model, ids, mask, config).sequences.numpy()
    np.testing.assert_array_equal(a, b)
    greedy = generate(model, ids, mask, GenerationConfig(max_new_tokens=6, do_sample=False)).sequences.numpy()
    top1 = generate(model, ids, mask, GenerationConfig(max_new_tokens=6, top_k=1, temperature=2.0)).sequences
    np.testing.assert_array_equal(top1.numpy(), greedy)


def test_sampling_by_row_position_gives_each_row_the_same_tokens_however_the_batch_is_split():
    """SampleRows: rows 0 and 2 sampled alone (as one data rank would) equal the same rows of the whole batch."""
    from alignment.models.generation import SampleRows

    model = tiny_model()
    ids, mask = left_padded_batch()
    config = GenerationConfig(max_new_tokens=6, do_sample=True, temperature=1.5, top_p=0.95)
    paddle.seed(5)
    whole = generate(model, ids, mask, config, rows=SampleRows(paddle.to_tensor([0, 1, 2]), 3)).sequences.numpy()
    paddle.seed(5)
    part = generate(model, paddle.gather(ids, paddle.to_tensor([0, 2])), paddle.gather(mask, paddle.to_tensor([0, 2])),
                    config, rows=SampleRows(paddle.to_tensor([0, 2]), 3)).sequences.numpy()
    np.testing.assert_array_equal(part, whole[[0, 2]])
    paddle.seed(6)
    other = generate(model, ids, mask, config, rows=SampleRows(paddle.to_tensor([0, 1, 2]), 3)).sequences.numpy()
    assert (other != whole).any()  # the noise really depends on the seed


def test_inverse_cdf_sampling_against_hand_computed_draws_and_frequencies():
    from alignment.models.sampling import inverse_cdf_sample

    # row 0: probs [.25, .75] (cdf .25, 1); row 1: [.5, 0 (filtered), .5] (cdf .5, .5, 1)
    logits = paddle.to_tensor([[0.0, np.log(3.0), -np.inf], [0.0, -np.inf, 0.0]], dtype="float32")
    draws = {u: inverse_cdf_sample(logits, paddle.to_tensor([u, u], dtype="float32")).numpy().tolist()
             for u in (0.0, 0.2, 0.25, 0.49, 0.5, 0.999999)}
    assert draws == {0.0: [0, 0], 0.2: [0, 0], 0.25: [1, 0], 0.49: [1, 0], 0.5: [1, 2], 0.999999: [1, 2]}
    many = paddle.to_tensor([[1.0, 0.0, 2.0, -np.inf, 0.5]] * 40000, dtype="float32")
    tokens = inverse_cdf_sample(many, paddle.rand([40000])).numpy()
    expected = np.exp([1.0, 0.0, 2.0, -np.inf, 0.5]) / np.exp([1.0, 0.0, 2.0, 0.5]).sum()
    np.testing.assert_allclose(np.bincount(tokens, minlength=5) / 40000, expected, atol=0.01)


def test_the_temperature_divides_the_logits_before_the_draw():
    from alignment.models.sampling import next_token

    # logits [0, ln 3] at temperature 0.5 -> [0, 2 ln 3]: probs [.1, .9] (cdf .1, 1); at 2 -> [0, ln 3 / 2]:
    # probs [.366, .634]; a uniform of .2 draws token 1 at 0.5 and token 0 at 2 (and at 1: probs [.25, .75], 0)
    logits = paddle.to_tensor([[0.0, np.log(3.0)]], dtype="float32")
    draws = {t: next_token(logits, GenerationConfig(max_new_tokens=1, temperature=t), None,
                           paddle.to_tensor([0.2], dtype="float32")).numpy().tolist() for t in (0.5, 1.0, 2.0)}
    assert draws == {0.5: [1], 1.0: [0], 2.0: [0]}
    assert next_token(logits, GenerationConfig(max_new_tokens=1, temperature=2.0), None,
                      paddle.to_tensor([0.37], dtype="float32")).numpy().tolist() == [1]  # just past .366


def test_min_new_tokens_ends_the_rows_right_after_the_minimum_when_every_other_token_is_eos():
    """Every token but one is an end token: each row draws that one for min_new_tokens tokens, then ends."""
    model = tiny_model()
    ids, mask = left_padded_batch()
    keep = 7
    ends = [t for t in range(model.config.vocab_size) if t != keep]
    for minimum in (1, 3, 5):
        out = generate(model, ids, mask, GenerationConfig(max_new_tokens=8, do_sample=False, eos_token_id=ends,
                                                           min_new_tokens=minimum))
        seq, lengths = out.sequences.numpy(), out.response_mask.numpy().sum(axis=1)
        assert lengths.tolist() == [minimum + 1] * 3, minimum
        assert (seq[:, 6:6 + minimum] == keep).all() and all(t in ends for t in seq[:, 6 + minimum])


def test_logit_processors_against_hand_computed_values():
    logits = paddle.to_tensor([[2.0, -1.0, 0.5, 1.0]])
    seen = paddle.to_tensor([[True, True, False, False]])
    np.testing.assert_allclose(apply_repetition_penalty(logits, seen, 2.0).numpy(), [[1.0, -2.0, 0.5, 1.0]])
    assert np.isinf(apply_top_k(logits, 2).numpy()).tolist() == [[False, True, True, False]]
    # probs of [2, -1, .5, 1] = [.574, .029, .128, .211]: top_p .7 keeps 2.0 and 1.0 (mass .785)
    kept = ~np.isinf(apply_top_p(logits, 0.7).numpy())
    assert kept.tolist() == [[True, False, False, True]]
    assert (~np.isinf(apply_top_p(logits, 0.5).numpy())).tolist() == [[True, False, False, False]]


def test_recompute_gives_the_same_gradients():
    grads = []
    for recompute in (False, True):
        model = tiny_model(recompute=recompute)
        model.train()
        ids, mask = left_padded_batch()
        model(ids, mask).logits.mean().backward()
        grads.append(model.model.layers[0].self_attn.q_proj.weight.grad.numpy())
    np.testing.assert_allclose(grads[0], grads[1], atol=1e-7)


def test_min_new_tokens_blocks_eos_until_that_many_tokens():
    from alignment.models.sampling import block_tokens

    logits = paddle.to_tensor([[1.0, 5.0, 2.0], [0.0, -1.0, 3.0]])
    blocked = block_tokens(logits, [1, 2], paddle.to_tensor([True, True])).numpy()
    assert blocked[:, 0].tolist() == [1.0, 0.0] and np.isneginf(blocked[:, 1:]).all()
    only_row_1 = block_tokens(logits, [1, 2], paddle.to_tensor([False, True])).numpy()
    np.testing.assert_array_equal(only_row_1[0], logits.numpy()[0])
    np.testing.assert_array_equal(only_row_1[1], blocked[1])
    model = tiny_model()
    ids, mask = left_padded_batch()
    free = generate(model, ids, mask, GenerationConfig(max_new_tokens=8, do_sample=False)).sequences.numpy()
    eos = int(free[0, 6])  # row 0's first greedy token is made the eos: without a minimum, row 0 stops at once
    for minimum, sample in ((0, False), (3, False), (3, True)):
        paddle.seed(5)
        out = generate(model, ids, mask, GenerationConfig(max_new_tokens=8, do_sample=sample, eos_token_id=[eos],
                                                           min_new_tokens=minimum))
        seq, lengths = out.sequences.numpy(), out.response_mask.numpy().sum(axis=1)
        assert (lengths >= max(minimum, 1)).all()
        assert eos not in seq[:, 6:6 + minimum]  # no eos among the first `minimum` tokens of any row
        if minimum == 0 and not sample:
            assert lengths[0] == 1
    with pytest.raises(ValueError, match="min_new_tokens"):
        GenerationConfig(max_new_tokens=4, min_new_tokens=5)


@pytest.mark.parametrize("tied", [False, True])
def test_token_log_probs_at_a_temperature_equal_log_softmax_of_the_divided_logits(tied):
    """The temperature is applied to the hidden states ((h / T) W = (h W) / T for the bias-free head); the
    log-probs, their gradient and the logged entropy equal the definition on logits / T."""
    model = tiny_model(tie_word_embeddings=tied)
    ids, _ = left_padded_batch()
    hidden, _ = model.model(ids)  # [3, 6, 32]
    states = hidden[:, :-1].detach()
    states.stop_gradient = False
    labels = ids[:, 1:]
    log_probs, entropy = model.token_log_probs(states, labels, temperature=0.7, with_entropy=True)  # [3, 5] each
    logits = (model.compute_logits(states.detach()) / 0.7).numpy().astype(np.float64)  # [3, 5, 97]
    logits -= logits.max(-1, keepdims=True)
    log_softmax = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    want = np.take_along_axis(log_softmax, labels.numpy()[..., None], -1)[..., 0]
    np.testing.assert_allclose(log_probs.numpy(), want, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(entropy.numpy(), -(np.exp(log_softmax) * log_softmax).sum(-1), rtol=1e-5, atol=1e-5)
    assert entropy.stop_gradient and not log_probs.stop_gradient
    log_probs.sum().backward()  # d/dh of sum log p = ((onehot - p) / T) W^T: the same as the divided logits give
    reference = states.detach()
    reference.stop_gradient = False
    plain = paddle.nn.functional.log_softmax(model.compute_logits(reference) / 0.7, axis=-1)
    paddle.take_along_axis(plain, labels.unsqueeze(-1), -1).sum().backward()
    np.testing.assert_allclose(states.grad.numpy(), reference.grad.numpy(), rtol=1e-4, atol=1e-5)
