"""Speculative decoding (alignment/models/speculative.py, speculative_step.py): the drafter and the acceptance
rules on hand-computed values; in the engine, greedy tokens equal plain decoding's (ends inside accepted drafts
included), sampled tokens are distributed as the policy's (chi-square over thousands of draws against the
probabilities of full forwards), log-probs equal a plain forward's, and a row's bits do not depend on its
neighbours."""
import math

import numpy as np
import paddle
import paddle.nn.functional as F
import pytest

from alignment.envs import Environment, StepResult
from alignment.models import GenerationConfig, generate
from alignment.models.engine import DecodeEngine, DecodeSequence
from alignment.models.sampling import next_token, without_tokens
from alignment.models.speculative import (acceptance_probability, accepted_lengths, draft_probabilities,
                                          greedy_agreement, point_mass_agreement, position_logits, prompt_lookup,
                                          residual_distribution)
from tests.gemm_rows import needs_rows_their_own
from tests.speculative_helpers import (PROMPTS, assert_log_probs_are_a_full_forwards, chi_square, chi_square_critical,
                                       copier, full_forward_log_probs, play_turns, sample_counts, sampler_probabilities)


def decode(model, prompts, config, fused=True, slots=None, rngs=None, room=4):
    """Each prompt a sequence of up to `room` tokens more than the prompt and max_new_tokens. -> (per prompt:
    turn, log-probs, tokens each step appended, ending), the engine."""
    engine = DecodeEngine(model, slots or len(prompts), 96, fused=fused)
    seqs = [DecodeSequence(p, config, len(p) + config.max_new_tokens + room, log_prob_temperature=1.0,
                     rng=None if rngs is None else rngs[i]) for i, p in enumerate(prompts)]
    for seq in seqs:
        engine.add(seq)
    steps = [[] for _ in seqs]
    while engine.busy():
        before = [len(s.turn) for s in seqs]
        engine.step()
        for i, seq in enumerate(seqs):
            if len(seq.turn) > before[i]:
                steps[i].append(len(seq.turn) - before[i])
    return [(s.turn, s.turn_log_probs, steps[i], s.ending) for i, s in enumerate(seqs)], engine


# ------------------------------------------------------------------ the math, golden values

def test_prompt_lookup_takes_the_earliest_match_of_the_longest_ngram():
    ids = [3, 2, 8, 1, 2, 9, 1, 2]
    assert prompt_lookup(ids, 4, max_n=2) == [9, 1, 2]  # [1, 2] at 3; the draft runs up to the last id
    assert prompt_lookup(ids, 2, max_n=2) == [9, 1]
    assert prompt_lookup(ids, 4, max_n=1) == [8, 1, 2, 9]  # [2] first at 1
    assert prompt_lookup([1, 2, 3, 4, 2, 3], 4, max_n=3, min_n=2) == [4, 2, 3]  # vLLM's docstring example
    assert prompt_lookup([5, 6, 7, 6], 3, max_n=3, min_n=2) == []  # [7, 6] never occurred before
    assert prompt_lookup([5, 6, 7, 6], 3, max_n=3, min_n=1) == [7, 6]
    assert prompt_lookup([5], 3, max_n=3) == [] and prompt_lookup(ids, 0, max_n=2) == []


def test_the_acceptance_rule_and_the_residual_give_p():
    p = paddle.to_tensor([[0.5, 0.3, 0.2], [0.1, 0.6, 0.3]])
    q = paddle.to_tensor([[0.2, 0.6, 0.2], [0.4, 0.4, 0.2]])
    np.testing.assert_allclose(acceptance_probability(p, q, paddle.to_tensor([1, 1])).numpy(), [0.5, 1.0])
    np.testing.assert_allclose(residual_distribution(p, q).numpy(), [[1, 0, 0], [0, 2 / 3, 1 / 3]], rtol=1e-6)
    # q a point mass on x = 1: keep x with p(x) = 0.3, else draw from p without x: [5/7, 0, 2/7]
    point = paddle.to_tensor([[0.0, 1.0, 0.0]])
    residual = residual_distribution(p[:1], point)
    np.testing.assert_allclose(residual.numpy(), [[5 / 7, 0, 2 / 7]], rtol=1e-6)
    keep = acceptance_probability(p[:1], point, paddle.to_tensor([1])).numpy()[0]
    emitted = keep * np.eye(3)[1] + (1 - keep) * residual.numpy()[0]  # the law of the emitted token
    np.testing.assert_allclose(emitted, p.numpy()[0], rtol=1e-6)


def test_a_draw_without_a_rejected_token_leaves_it_out_after_the_filters():
    logits = paddle.to_tensor([[3.0, 2.0, 1.0, 0.0]] * 4)
    config = GenerationConfig(top_k=2)
    uniform = paddle.to_tensor([0.001, 0.3, 0.7, 0.999])
    drawn = next_token(logits, config, None, uniform, excluded=paddle.to_tensor([0, 0, 0, 0]))
    assert drawn.numpy().tolist() == [1, 1, 1, 1]  # top-2 is {0, 1}: without 0 only 1 is left, never 2
    blocked = without_tokens(logits[:2], paddle.to_tensor([2, -1])).numpy()
    assert np.isneginf(blocked[0, 2]) and np.isfinite(blocked[1]).all()


def test_draft_probabilities_and_prefixes():
    inf = float("-inf")
    logits = paddle.to_tensor([[0.0, math.log(3.0), inf], [0.0, inf, inf], [0.0, inf, inf]])
    p, sole = draft_probabilities(logits, paddle.to_tensor([1, 0, 2]))
    assert p.numpy().tolist() == pytest.approx([0.75, 1.0, 0.0], abs=1e-7) and p.numpy()[2] == 0.0
    assert sole.numpy().tolist() == [False, True, False]  # a filtered draft token is never kept
    keep = point_mass_agreement(np.array([[0.5, 0.5, 0.0]]), np.array([[0.2, 0.8, 0.1]]),
                                np.array([[False, True, False]]))
    assert keep.tolist() == [[True, True, False]]
    keep = np.array([[1, 1, 0, 1], [1, 1, 1, 1], [0, 1, 1, 1]], bool)
    assert accepted_lengths(keep, np.array([4, 2, 4])).tolist() == [2, 2, 0]
    assert greedy_agreement(np.array([[4, 5, 6]]), np.array([[4, 5, 7]])).tolist() == [[True, True, False]]


def test_position_logits_block_eos_and_penalise_what_each_position_has_seen():
    config = GenerationConfig(do_sample=False, min_new_tokens=3, eos_token_id=2, repetition_penalty=2.0)
    logits = paddle.ones([1, 3, 6])  # [b, k, vocab]
    seen = paddle.to_tensor([[True, False, False, False, False, False]])
    out = position_logits(logits, config, seen, paddle.to_tensor([[4, 1, 3]]), np.array([1])).numpy()
    assert np.isneginf(out[:2, 2]).all() and out[2, 2] == 1.0  # 1 + 0, 1 + 1 < 3 tokens: eos blocked
    assert out[0].tolist()[:2] == [0.5, 1.0] and out[0, 4] == 0.5  # seen {0, 4}, then {0, 4, 1}, {0, 4, 1, 3}
    assert out[1, 1] == 0.5 and out[2, 3] == 0.5 and out[1, 3] == 1.0


def test_the_lookup_keys_are_checked():
    with pytest.raises(ValueError, match="prompt_lookup_num_tokens"):
        GenerationConfig(prompt_lookup_num_tokens=-1)
    with pytest.raises(ValueError, match="prompt_lookup_min"):
        GenerationConfig(prompt_lookup_num_tokens=4, prompt_lookup_max=2, prompt_lookup_min=3)


# ------------------------------------------------------------------ in the engine

@pytest.mark.parametrize("fused", [True, False], ids=["fused", "layers"])
def test_greedy_tokens_are_plain_decodings_and_drafts_are_accepted(fused):
    model = copier()
    plain = GenerationConfig(max_new_tokens=24, do_sample=False, eos_token_id=[97])
    spec = GenerationConfig(max_new_tokens=24, do_sample=False, eos_token_id=[97], prompt_lookup_num_tokens=4)
    base, _ = decode(model, PROMPTS, plain, fused)
    fast, engine = decode(model, PROMPTS, spec, fused)
    for (turn, log_probs, _, ending), (turn2, log_probs2, steps, ending2) in zip(base, fast):
        assert turn2 == turn and ending2 == ending
        np.testing.assert_allclose(log_probs2, log_probs, atol=2e-5)
    stats = engine.speculator.stats
    assert stats["accepted"] >= 20 and stats["drafted"] > stats["accepted"]  # accepted and rejected drafts
    assert sum(len(t) for t, *_ in fast) == sum(sum(s) for *_, s, _ in fast)
    assert max(max(s) for *_, s, _ in fast) >= 3  # steps that gave several tokens
    assert sum(len(s) for *_, s, _ in fast) < sum(len(s) for *_, s, _ in base)


@pytest.mark.parametrize("end, settings, room, length", [
    ("eos", dict(max_new_tokens=20, eos_token_id=[25]), 4, 4), ("length", dict(max_new_tokens=5), 4, 5),
    ("budget", dict(max_new_tokens=20), -14, 6)])
def test_a_turn_ending_inside_an_accepted_draft_ends_as_plain_decoding(end, settings, room, length):
    model = copier()
    prompt = [[21, 22, 23, 24, 25, 26, 27, 21, 22, 23, 24, 25, 26, 27, 21]]
    (turn, _, _, ending), = decode(model, prompt, GenerationConfig(do_sample=False, **settings), room=room)[0]
    (turn2, _, steps, ending2), = decode(model, prompt, GenerationConfig(
        do_sample=False, prompt_lookup_num_tokens=6, **settings), room=room)[0]
    assert turn2 == turn and ending2 == ending == end and len(turn) == length
    assert steps[-1] > 1  # the last step gave several tokens: the turn ended inside the draft


def test_an_eos_in_the_draft_before_min_new_tokens_is_not_accepted():
    model = copier()
    prompt = [[21, 22, 23, 24, 25, 26, 27, 21, 22, 23, 24, 25, 26, 27, 21]]
    settings = dict(do_sample=False, max_new_tokens=20, eos_token_id=[25], min_new_tokens=4)
    (turn, _, _, ending), = decode(model, prompt, GenerationConfig(**settings))[0]
    (turn2, _, _, ending2), = decode(model, prompt, GenerationConfig(prompt_lookup_num_tokens=6, **settings))[0]
    assert turn2 == turn and ending2 == ending == "length" and turn[:3] == [22, 23, 24]  # the draft: 22, .., 25


def test_turns_resumed_after_an_end_inside_a_draft_go_on_as_plain_decoding():
    model = copier()
    play = lambda k: play_turns(model, GenerationConfig(  # noqa: E731
        max_new_tokens=4, do_sample=False, prompt_lookup_num_tokens=k, prompt_lookup_min=1))
    plain, _ = play(0)
    fast, engine = play(3)
    assert fast == plain and engine.speculator.stats["accepted"] > 4
    for slot, seq in enumerate(engine.running):  # nothing written past a slot's tokens, the scratch column zero
        assert int(engine.cache.lengths[slot]) == seq.fed
        for t in engine.cache.k + engine.cache.v:
            assert not t[slot, :, seq.fed:].numpy().any()


def test_top_log_probs_and_stop_functions_inside_drafts_are_plain_decodings():
    model = copier()
    stop = lambda turn: turn[-2:] == [12, 13]  # noqa: E731  (a stop string's test on the turn's ids)

    def run(k):
        config = GenerationConfig(max_new_tokens=30, do_sample=False, prompt_lookup_num_tokens=k)
        engine = DecodeEngine(model, 2, 96)
        seqs = [DecodeSequence(p, config, 60, stop=stop, top_logprobs=3) for p in PROMPTS[:2]]
        for seq in seqs:
            engine.add(seq)
        while engine.busy():
            engine.step()
        return seqs, engine.speculator.stats

    (plain, _), (fast, stats) = run(0), run(5)
    assert stats["accepted"] >= 5
    for a, b in zip(plain, fast):
        assert b.turn == a.turn and b.ending == a.ending and len(b.turn_top) == len(b.turn)
        assert [[i for i, _ in top] for top in b.turn_top] == [[i for i, _ in top] for top in a.turn_top]
        np.testing.assert_allclose([[v for _, v in top] for top in b.turn_top],
                                   [[v for _, v in top] for top in a.turn_top], atol=2e-5)
    assert plain[0].ending == "stop"


def test_generate_with_prompt_lookup_gives_plain_generates_tokens():
    model = copier()
    ids = paddle.to_tensor([[0, 0, 10, 11, 12, 13, 10], [0, 1, 2, 3, 4, 0, 1]])
    mask = paddle.to_tensor([[0, 0, 1, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1, 1]])
    plain = generate(model, ids, mask, GenerationConfig(max_new_tokens=12, do_sample=False))
    fast = generate(model, ids, mask, GenerationConfig(max_new_tokens=12, do_sample=False,
                                                       prompt_lookup_num_tokens=5))
    assert (fast.sequences.numpy() == plain.sequences.numpy()).all()
    paddle.seed(1)  # sampled, the rows' numbers from the engine's batch draws (k more per step)
    sampled = generate(model, ids, mask, GenerationConfig(max_new_tokens=12, prompt_lookup_num_tokens=5),
                       log_prob_temperature=1.0)
    assert_log_probs_are_a_full_forwards(model, ids, mask, sampled)


@needs_rows_their_own
def test_sampled_log_probs_are_a_plain_forwards_and_a_rows_bits_its_own():
    model = copier()
    config = GenerationConfig(max_new_tokens=16, temperature=0.7, top_p=0.9, prompt_lookup_num_tokens=4)
    rngs = lambda seeds: [np.random.default_rng([5, s]) for s in seeds]  # noqa: E731
    rows, engine = decode(model, PROMPTS, config, rngs=rngs(range(4)))
    assert engine.speculator.stats["accepted"] >= 5
    for prompt, (turn, log_probs, _, _) in zip(PROMPTS, rows):
        reference = full_forward_log_probs(model, prompt, turn, 1.0)
        np.testing.assert_allclose(log_probs, reference.squeeze(-1), atol=1e-5)
    alone, _ = decode(model, PROMPTS[2:3], config, slots=4, rngs=rngs([2]))
    others, _ = decode(model, [PROMPTS[2], [5, 6, 7, 8], [50, 51, 52, 50]], config, rngs=rngs([2, 9, 8]))
    assert alone[0][:2] == rows[2][:2] == others[0][:2]  # the same tokens and log-prob bits
    assert decode(model, PROMPTS, config, fused=False, rngs=rngs(range(4)))[0][2][0] == rows[2][0]


@pytest.mark.parametrize("k, prompt, filters", [
    (2, [1, 2, 3, 4, 5, 6, 7, 0, 1, 2, 3], dict(temperature=0.8, top_k=5, eos_token_id=5, min_new_tokens=2)),
    (1, [1, 2, 3, 1, 2, 3, 4, 1, 2], dict(top_p=0.9, repetition_penalty=1.5))],
    ids=["k2-top-k-eos", "k1-top-p-penalty"])
def test_sampled_tokens_are_distributed_as_the_policys(k, prompt, filters):
    vocab, draws = 8, 4000
    model = copier(vocab=vocab, cycle=4, strength=2.0, damp=0.3)
    config = GenerationConfig(max_new_tokens=3, prompt_lookup_num_tokens=k, **filters)
    probs = sampler_probabilities(model, prompt, config, vocab)  # [t1, t2, pos, next]
    exact = probs[0, 0, 0][:, None, None] * probs[:, 0, 1][:, :, None] * probs[:, :, 2]  # [t1, t2, t3]
    engine = DecodeEngine(model, 100, 16, prefill_together=True)
    counts = sample_counts(engine, prompt, config, draws, vocab)
    stats = engine.speculator.stats
    assert stats["accepted"] > 300 and stats["drafted"] - stats["accepted"] > 300  # both paths, many times
    statistic, dof = chi_square(counts.reshape(-1), exact.reshape(-1) * draws)
    assert dof >= 10 and statistic < chi_square_critical(dof)
    # the test has power: the law where a rejected token is drawn again from p (no exclusion) fails it
    first = probs[0, 0, 0]  # [t1]
    draft = [prompt_lookup(prompt + [t], 1, 3) for t in range(vocab)]  # [t1] the first draft token, if any
    wrong = probs[:, 0, 1].copy()  # [t1, t2]
    for t, d in enumerate(draft):
        if d:
            keep = probs[t, 0, 1, d[0]]
            wrong[t] = keep * np.eye(vocab)[d[0]] + (1 - keep) * probs[t, 0, 1]
    statistic, dof = chi_square(counts.sum(axis=2).reshape(-1), (first[:, None] * wrong).reshape(-1) * draws)
    assert statistic > 3 * chi_square_critical(dof)


# ------------------------------------------------------------------ the callers' configs

def test_the_gateway_serves_with_prompt_lookup_the_tokens_of_plain_decoding(tiny_model_dir):
    from alignment.commands.serve import parse_args
    from alignment.gateway.protocol import parse_chat_request
    from alignment.gateway.serving import build_gateway
    from alignment.models import LlamaForCausalLM, Tokenizer

    model, tokenizer = LlamaForCausalLM.from_pretrained(tiny_model_dir), Tokenizer.from_pretrained(tiny_model_dir)
    model.eval()
    request = parse_chat_request({"messages": [{"role": "user", "content": "Repeat: red green blue red green"}],
                                  "temperature": 0, "max_tokens": 24, "logprobs": True})
    choices, gateways = [], []
    for k in (0, 4):
        gateway = build_gateway(model, tokenizer, 2, 256, 24, prompt_lookup=k)
        future = gateway.submit(None, request)
        gateway.pump(future.done)
        choices.append(future.result().choices[0])
        gateways.append(gateway)
    assert choices[1].tokens == choices[0].tokens and len(choices[0].tokens) > 8
    np.testing.assert_allclose([t["logprob"] for t in choices[1].logprobs],
                               [t["logprob"] for t in choices[0].logprobs], atol=2e-5)
    assert gateways[1].engine.speculator.stats["verified"] > 0 == gateways[0].engine.speculator.stats["verified"]
    assert parse_args(["--model", "m", "--prompt-lookup-num-tokens", "4"]).prompt_lookup_num_tokens == 4
    with pytest.raises(SystemExit):
        parse_args(["--model", "m", "--prompt-lookup-num-tokens", "-1"])


def test_rollouts_take_the_key_from_the_rl_arguments():
    from types import SimpleNamespace

    from alignment.config.ppo import PPOArguments
    from alignment.ppo.rollout.samplers import rollout_generation_config

    ppo = PPOArguments(prompt_lookup_num_tokens=6)
    actor = SimpleNamespace(config=SimpleNamespace(eos_token_ids=[2]))
    config = rollout_generation_config(ppo, actor, SimpleNamespace(eos_token_id=2, pad_token_id=0))
    assert config.prompt_lookup_num_tokens == 6 and config.do_sample
    with pytest.raises(ValueError, match="prompt_lookup_num_tokens"):
        PPOArguments(prompt_lookup_num_tokens=6, rollout_decode="static").validate()


class Turns(Environment):
    """Ends after row["turns"] turns, answering each with the same user message."""
    NAME = "test-speculative-turns"

    def reset(self, row):
        self.turns, self.k = row["turns"], 0
        return [{"role": "user", "content": row["input"]}]

    def step(self, assistant_message):
        self.k += 1
        done = self.k == self.turns
        return StepResult([] if done else [{"role": "user", "content": "Say it again, please."}], 1.0, done)


@pytest.mark.parametrize("sample", [False, True], ids=["greedy", "sampled"])
def test_episodes_with_prompt_lookup(tiny_model_dir, sample):
    from alignment import cpu_kernels as kernels
    from alignment.envs.multiturn import multi_turn_rollout
    from alignment.models import LlamaForCausalLM, Tokenizer

    model, tokenizer = LlamaForCausalLM.from_pretrained(tiny_model_dir), Tokenizer.from_pretrained(tiny_model_dir)
    model.eval()
    chats = ["What is two plus two?", "Hi", "Tell me a long story about a cat and a dog, please."]
    rows = [{"input": chats[i], "turns": turns} for i, turns in enumerate([2, 3, 1])]

    def play(k):
        config = GenerationConfig(max_new_tokens=10, do_sample=sample, temperature=0.8, prompt_lookup_num_tokens=k,
                                  eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
        return multi_turn_rollout(model, tokenizer, [Turns() for _ in rows], rows, config, 6, 200,
                                  log_prob_temperature=0.8, row_seeds=[[4, i] for i in range(len(rows))])

    plain, fast = play(0), play(5)
    for a, b in zip(plain, fast):
        actions = np.flatnonzero(b.action_mask)
        ids = np.asarray(b.input_ids)
        forced = F.log_softmax(model(paddle.to_tensor(ids[None])).logits[0] / 0.8, axis=-1).numpy()  # [L, vocab]
        np.testing.assert_allclose(np.asarray(b.log_probs)[actions], forced[actions - 1, ids[actions]], atol=1e-5)
        if not sample:
            assert b.input_ids == a.input_ids and b.num_turns == a.num_turns
    if not sample and not any(kernels.chosen(name) for name in kernels.REPLACES):
        # the same tokens, log-probs from other (verify) forwards: not all the same bits with Paddle's operations
        # (our CPU kernels compute each row alike in any batch, alignment/cpu_kernels)
        assert any(a.log_probs != b.log_probs for a, b in zip(plain, fast))
