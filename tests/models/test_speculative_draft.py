"""Speculative decoding with a draft model (alignment/models/draft_model.py, speculative_step.py): the residual and
acceptance rules on hand-computed values; in the engine, greedy tokens equal plain decoding's with a draft that
often agrees (the policy's layer-dropped copy) and one that rarely does (another model), sampled tokens are
distributed as the policy's (chi-square over thousands of draws against full forwards' probabilities, with the
power to reject the law a wrong residual gives), log-probs are the policy's, and a row's bits do not depend on its
neighbours."""
import numpy as np
import paddle
import pytest

from alignment.models import GenerationConfig, generate
from alignment.models.draft_model import DraftModel, common_prefix, layer_dropped
from alignment.models.engine import DecodeEngine, DecodeSequence
from alignment.models.speculative import (draw_from, filtered_probabilities, ratio_agreement,
                                          rejection_distribution)
from tests.speculative_helpers import (PROMPTS, assert_log_probs_are_a_full_forwards, chi_square, chi_square_critical,
                                       copier, full_forward_log_probs, play_turns, sample_counts, sampler_probabilities)
from tests.models.test_model import tiny_model


def run(model, prompts, config, draft=None, fused=True, slots=None, rngs=None):
    """Each prompt a sequence of max_new_tokens + 4 tokens more than the prompt -> (sequences, engine)."""
    engine = DecodeEngine(model, slots or len(prompts), 96, fused=fused, draft=draft)
    seqs = [DecodeSequence(p, config, len(p) + config.max_new_tokens + 4, log_prob_temperature=1.0,
                     rng=None if rngs is None else rngs[i]) for i, p in enumerate(prompts)]
    for seq in seqs:
        engine.add(seq)
    steps = 0
    while engine.busy():
        engine.step()
        steps += 1
    return seqs, engine, steps


# ------------------------------------------------------------------ the math, golden values

def test_the_residual_acceptance_and_draw_on_hand_computed_values():
    inf = float("-inf")
    p = filtered_probabilities(paddle.to_tensor([[0.0, np.log(3.0), inf]]))  # [1, 3]: [0.25, 0.75, 0] exactly 0
    assert p.numpy()[0, 2] == 0.0 and p.numpy()[0, :2].tolist() == pytest.approx([0.25, 0.75])
    q = paddle.to_tensor([[0.5, 0.25, 0.25]])
    np.testing.assert_allclose(rejection_distribution(p, q).numpy(), [[0, 1, 0]], atol=1e-7)
    same = rejection_distribution(p, p).numpy()  # max(0, p - q) sums to 0: p itself, never NaN
    np.testing.assert_allclose(same, p.numpy())
    both = paddle.concat([p, p])  # [2 positions, vocab]: x = 0 (p / q = 0.5), x = 1 (p / q = 3: always kept)
    keep = ratio_agreement(both, paddle.concat([q, q]), paddle.to_tensor([0, 1]), np.array([[0.49, 0.999]]))
    assert keep.tolist() == [[True, True]]
    keep = ratio_agreement(both, paddle.concat([q, q]), paddle.to_tensor([0, 1]), np.array([[0.51, 0.0]]))
    assert keep.tolist() == [[False, True]]
    drawn = draw_from(paddle.to_tensor([[0.25, 0.75, 0.0]] * 3), paddle.to_tensor([0.0, 0.26, 0.9999]))
    assert drawn.numpy().tolist() == [0, 1, 1]  # the zero-probability token is never drawn
    assert common_prefix([1, 2, 3], [1, 2, 4, 5]) == 2 and common_prefix([1, 2], [1, 2, 3]) == 2


def test_layer_dropped_keeps_every_other_layer_and_the_rest():
    model = tiny_model(num_hidden_layers=4)
    small = layer_dropped(model, 2)
    assert small.config.num_hidden_layers == 2 and model.config.num_hidden_layers == 4
    for mine, theirs in [(0, 0), (1, 2)]:
        np.testing.assert_array_equal(small.model.layers[mine].mlp.down_proj.weight.numpy(),
                                      model.model.layers[theirs].mlp.down_proj.weight.numpy())
    np.testing.assert_array_equal(small.model.embed_tokens.weight.numpy(), model.model.embed_tokens.weight.numpy())
    small.model.embed_tokens.weight.set_value(paddle.zeros_like(small.model.embed_tokens.weight))
    assert model.model.embed_tokens.weight.numpy().any()  # a copy


def test_the_keys_and_the_vocabulary_are_checked():
    model = copier()
    with pytest.raises(ValueError, match="vocabulary of 50 tokens, the policy's has 98"):
        DecodeEngine(model, 2, 32, draft=DraftModel(tiny_model(vocab_size=50)))
    with pytest.raises(ValueError, match="num_assistant_tokens"):
        GenerationConfig(num_assistant_tokens=-1)
    both = GenerationConfig(do_sample=False, max_new_tokens=4, prompt_lookup_num_tokens=3)
    with pytest.raises(ValueError, match="set one of num_assistant_tokens and prompt_lookup_num_tokens"):
        run(model, PROMPTS[:1], both, DraftModel.layer_dropped(model))
    off = GenerationConfig(do_sample=False, max_new_tokens=6, num_assistant_tokens=0)
    assert run(model, PROMPTS[:1], off, DraftModel.layer_dropped(model))[1].speculator.stats["verified"] == 0


# ------------------------------------------------------------------ in the engine

@pytest.mark.parametrize("fused", [True, False], ids=["fused", "layers"])
@pytest.mark.parametrize("kind", ["layer-dropped", "other"])
def test_greedy_tokens_are_plain_decodings(kind, fused):
    model = copier()
    draft = DraftModel(layer_dropped(model) if kind == "layer-dropped" else tiny_model(vocab_size=98, hidden_size=16),
                       fused=fused)
    plain = GenerationConfig(max_new_tokens=24, do_sample=False, eos_token_id=[97])
    spec = GenerationConfig(max_new_tokens=24, do_sample=False, eos_token_id=[97], num_assistant_tokens=4)
    base, _, base_steps = run(model, PROMPTS, plain, fused=fused)
    fast, engine, steps = run(model, PROMPTS, spec, draft, fused=fused)
    for a, b in zip(base, fast):
        assert b.turn == a.turn and b.ending == a.ending
        np.testing.assert_allclose(b.turn_log_probs, a.turn_log_probs, atol=2e-5)
    stats = engine.speculator.stats
    if kind == "layer-dropped":  # agrees often: fewer steps
        assert stats["accepted"] >= 40 and steps < base_steps * 0.6
    else:  # agrees rarely: about one token a step, the tokens still plain decoding's
        assert stats["accepted"] <= 0.1 * stats["drafted"] and stats["drafted"] > 50


def test_resumed_turns_keep_the_draft_cache_to_the_accepted_tokens():
    model = copier()

    config = GenerationConfig(max_new_tokens=5, do_sample=False, num_assistant_tokens=3)
    plain, _ = play_turns(model, config)
    fast, engine = play_turns(model, config, DraftModel.layer_dropped(model))
    drafter = engine.speculator.drafter
    assert fast == plain and engine.speculator.stats["accepted"] > 8
    for slot, seq in enumerate(engine.running):  # a prefix of the sequence, nothing written past it
        holder, held = drafter.held[slot]
        used = int(drafter.cache.lengths[slot])
        assert holder is seq and used == len(held) and held == (seq.history + seq.pending)[:used]
        for t in drafter.cache.k + drafter.cache.v:
            assert t[slot, :, :used].numpy().any() and not t[slot, :, used:].numpy().any()


def test_generate_with_a_draft_model():
    model = copier()
    ids = paddle.to_tensor([[0, 0, 10, 11, 12, 13, 10], [0, 1, 2, 3, 4, 0, 1]])
    mask = paddle.to_tensor([[0, 0, 1, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1, 1]])
    draft = DraftModel.layer_dropped(model)
    plain = generate(model, ids, mask, GenerationConfig(max_new_tokens=12, do_sample=False))
    fast = generate(model, ids, mask, GenerationConfig(max_new_tokens=12, do_sample=False), draft=draft)
    assert (fast.sequences.numpy() == plain.sequences.numpy()).all()
    paddle.seed(1)  # sampled, the numbers from the engine's batch draws (2k more per step)
    sampled = generate(model, ids, mask, GenerationConfig(max_new_tokens=12, top_k=20), log_prob_temperature=1.0,
                       draft=draft)
    assert_log_probs_are_a_full_forwards(model, ids, mask, sampled)


def test_sampled_log_probs_are_the_policys_and_a_rows_bits_its_own():
    model = copier()
    draft = DraftModel.layer_dropped(model)
    config = GenerationConfig(max_new_tokens=16, temperature=0.7, top_p=0.9, repetition_penalty=1.2,
                              num_assistant_tokens=4)
    rngs = lambda seeds: [np.random.default_rng([5, s]) for s in seeds]  # noqa: E731
    rows, engine, _ = run(model, PROMPTS, config, draft, rngs=rngs(range(4)))
    stats = engine.speculator.stats
    assert stats["accepted"] >= 10 and stats["drafted"] > stats["accepted"]
    for prompt, seq in zip(PROMPTS, rows):
        reference = full_forward_log_probs(model, prompt, seq.turn, 1.0)
        np.testing.assert_allclose(seq.turn_log_probs, reference.squeeze(-1), atol=1e-5)
    alone, _, _ = run(model, PROMPTS[2:3], config, draft, slots=4, rngs=rngs([2]))
    others, _, _ = run(model, [[5, 6, 7, 8], PROMPTS[2], [50, 51, 52, 50]], config, draft, rngs=rngs([9, 2, 8]))
    for seq in (alone[0], others[1]):  # the same tokens and log-prob bits, alone, in another slot, among others
        assert seq.turn == rows[2].turn and seq.turn_log_probs == rows[2].turn_log_probs


@pytest.mark.parametrize("prompt, filters, kind", [
    ([1, 2, 3, 4, 5, 6, 7, 0, 1, 2, 3], dict(temperature=0.8, top_k=5, eos_token_id=5, min_new_tokens=2), "other"),
    ([1, 2, 3, 1, 2, 3, 4, 1, 2], dict(top_p=0.9, repetition_penalty=1.5), "layer-dropped")],
    ids=["top-k-eos-other-draft", "top-p-penalty-layer-dropped"])
def test_sampled_tokens_are_distributed_as_the_policys(prompt, filters, kind):
    vocab, draws = 8, 4000
    model = copier(vocab=vocab, cycle=4, strength=2.0, damp=0.3)
    small = layer_dropped(model) if kind == "layer-dropped" else tiny_model(vocab_size=vocab)
    config = GenerationConfig(max_new_tokens=3, num_assistant_tokens=2, **filters)
    probs = sampler_probabilities(model, prompt, config, vocab)  # [t1, t2, pos, next]
    exact = probs[0, 0, 0][:, None, None] * probs[:, 0, 1][:, :, None] * probs[:, :, 2]  # [t1, t2, t3]
    engine = DecodeEngine(model, 100, 16, prefill_together=True, draft=DraftModel(small))
    counts = sample_counts(engine, prompt, config, draws, vocab)
    stats = engine.speculator.stats
    assert stats["accepted"] > 300 and stats["drafted"] - stats["accepted"] > 300  # both paths, many times
    statistic, dof = chi_square(counts.reshape(-1), exact.reshape(-1) * draws)
    assert dof >= 10 and statistic < chi_square_critical(dof)
    # the test has power: the law of t2 when the token after a rejection is drawn from p instead of
    # norm(max(0, p - q)) fails it (t2 is the first draft token, drawn from q after the prompt and t1)
    p, q = probs[:, 0, 1], sampler_probabilities(small, prompt, config, vocab)[:, 0, 1]  # [t1, t2] each
    kept = np.minimum(p, q)  # [t1, t2]: the first draft token drawn and accepted
    wrong = kept + (1 - kept.sum(axis=1, keepdims=True)) * p
    statistic, dof = chi_square(counts.sum(axis=2).reshape(-1), (probs[0, 0, 0][:, None] * wrong).reshape(-1) * draws)
    assert statistic > 2 * chi_square_critical(dof)
