"""The decode engine (alignment/models/engine.py): a sequence's tokens and log-probs are the same bits whatever
the other slots hold, which slot it has, and when it pauses and resumes; shared prompts are prefilled once; a slot
is reused from zeros; sizes are checked."""
import numpy as np
import paddle
import pytest

from alignment.models import GenerationConfig, LlamaConfig, LlamaForCausalLM
from alignment.models.engine import DecodeEngine, DecodeSequence
from alignment.models.prompt_groups import distinct_prompts
from tests.models.test_model import tiny_model

# SmolLM2-135M's layer shapes (2 of its 30 layers, a small vocabulary)
SMOLLM2_LAYERS = dict(vocab_size=500, hidden_size=576, intermediate_size=1536, num_hidden_layers=2,
                      num_attention_heads=9, num_key_value_heads=3, initializer_range=0.05)
SAMPLER = GenerationConfig(max_new_tokens=5, temperature=0.8, top_p=0.95, repetition_penalty=1.1,
                           min_new_tokens=1, eos_token_id=[7])


def smollm2_shaped():
    paddle.seed(3)
    model = LlamaForCausalLM(LlamaConfig(**SMOLLM2_LAYERS))
    model.eval()
    return model


def prompts(count, seed=0, vocab=97):
    rng = np.random.default_rng(seed)
    return [rng.integers(8, vocab, size=int(rng.integers(3, 12))).tolist() for _ in range(count)]


def play(model, rows, slots=None, turns=3, resume_after=None, fused=True, seeds=None, capacity=80, fixed_width=False):
    """Each row a sequence with its own seed (seeds[i], default i), `turns` turns, resumed with the ids [11, 12]
    after each; rows placed in the slots `slots`; resume_after[i]: engine steps row i waits before each resume
    (0: at once). -> per row (all sampled tokens, all log-probs)."""
    slots = slots or list(range(len(rows)))
    seeds = seeds or list(range(len(rows)))
    engine = DecodeEngine(model, max(slots) + 1, capacity, fused=fused, fixed_width=fixed_width)
    seqs = [DecodeSequence(row, SAMPLER, capacity, rng=np.random.default_rng([9, seed])) for row, seed in zip(rows, seeds)]
    for seq, slot in zip(seqs, slots):
        engine.add(seq, slot)
    tokens, log_probs = [[] for _ in rows], [[] for _ in rows]
    turns_left = [turns] * len(rows)
    waiting = {}  # row -> steps left before its resume
    while engine.busy() or waiting:
        for seq in engine.step() if engine.busy() else []:
            i = seqs.index(seq)
            tokens[i] += seq.turn
            log_probs[i] += seq.turn_log_probs
            turns_left[i] -= 1
            if turns_left[i]:
                waiting[i] = 0 if resume_after is None else resume_after[i]
        for i in list(waiting):
            if waiting[i] == 0:
                engine.resume(seqs[i], [11, 12])
                del waiting[i]
            else:
                waiting[i] -= 1
    return tokens, log_probs


@pytest.mark.parametrize("make", [tiny_model, smollm2_shaped], ids=["tiny", "smollm2-layers"])
def test_a_rows_bits_do_not_depend_on_its_neighbours_slot_or_timing(make):
    model = make()
    rows = prompts(4, vocab=model.config.vocab_size)
    base = play(model, rows)
    moved = play(model, rows[::-1], slots=[3, 2, 1, 0], seeds=[3, 2, 1, 0])  # the rows in other slots and order
    assert (moved[0][::-1], moved[1][::-1]) == base
    others = rows[:2] + prompts(2, seed=1, vocab=model.config.vocab_size)  # two neighbours changed
    changed = play(model, others)
    assert (changed[0][:2], changed[1][:2]) == (base[0][:2], base[1][:2])
    assert changed[0][2:] != base[0][2:]  # the changed rows really sampled something else
    late = play(model, rows, resume_after=[0, 3, 1, 7])  # rows pause while the others decode
    assert late == base
    assert len(set(map(tuple, base[0]))) > 1 and all(len(t) > 3 for t in base[0])


def test_the_layer_path_is_timing_invariant_too():
    model = tiny_model()
    rows = prompts(3)
    assert play(model, rows, fused=False) == play(model, rows, resume_after=[4, 0, 2], fused=False)


class Counting:
    """The model, counting the forwards of more than one position (prefills) and their shapes."""

    def __init__(self, model):
        self.model, self.config, self.prefills = model, model.config, []

    def parameters(self):
        return self.model.parameters()

    def __call__(self, input_ids, **kwargs):
        if input_ids.shape[1] > 1:
            self.prefills.append(list(input_ids.shape))
        return self.model(input_ids, **kwargs)


def test_sequences_added_together_with_one_prompt_prefill_it_once():
    model = tiny_model()
    counting = Counting(model)
    a, b = prompts(2)
    engine = DecodeEngine(counting, 5, 40)
    seqs = [DecodeSequence(p, SAMPLER, 40, rng=np.random.default_rng([1, i])) for i, p in enumerate([a, b, a, a, b])]
    for seq in seqs:
        engine.add(seq)
    engine.step()
    assert counting.prefills == [[1, len(a)], [1, len(b)]]
    first = [s.turn_log_probs[0] for s in seqs]
    alone = DecodeEngine(model, 5, 40)
    single = DecodeSequence(a, SAMPLER, 40, rng=np.random.default_rng([1, 3]))
    alone.add(single, 3)
    alone.step()
    assert single.turn_log_probs[0] == first[3]  # the copied prefill is the bits of the row's own


def test_a_reused_slot_starts_from_zeros_and_the_scratch_column_stays_zero():
    model = tiny_model()
    rows = prompts(2)
    engine = DecodeEngine(model, 2, 30)
    first = DecodeSequence(rows[0] * 2, SAMPLER, 30, rng=np.random.default_rng(0))
    engine.add(first)
    engine.add(DecodeSequence(rows[1], SAMPLER, 30, rng=np.random.default_rng(1)))
    while engine.busy():
        engine.step()
    engine.release(first)
    engine.add(DecodeSequence(rows[1][:2], SAMPLER, 30, rng=np.random.default_rng(2)), 0)
    k = engine.cache.k[0].numpy()
    assert not k[0].any()  # what the first sequence wrote is gone
    assert not k[:, :, engine.cache.scratch].any()


def test_sizes_are_checked():
    model = tiny_model()
    engine = DecodeEngine(model, 1, 10)
    with pytest.raises(ValueError, match="up to 11 tokens does not fit the engine's capacity of 10"):
        engine.add(DecodeSequence([5, 6], SAMPLER, 11))
    engine.add(DecodeSequence([5, 6], SAMPLER, 10))
    with pytest.raises(RuntimeError, match="no free slot"):
        engine.add(DecodeSequence([5, 6], SAMPLER, 10))
    with pytest.raises(ValueError, match="at least one id"):
        DecodeSequence([], SAMPLER, 10)


def test_rows_are_grouped_by_prompt_ids_and_mask_padding_included():
    ids = paddle.to_tensor([[0, 5, 6], [7, 5, 6], [0, 5, 6], [0, 5, 6], [7, 5, 6]])
    mask = paddle.to_tensor([[0, 1, 1], [1, 1, 1], [0, 1, 1], [1, 1, 1], [1, 1, 1]])
    first, inverse = distinct_prompts(ids, mask)
    groups = first.numpy()[inverse.numpy()]  # each row's representative row
    np.testing.assert_array_equal(ids.numpy()[groups], ids.numpy())
    np.testing.assert_array_equal(mask.numpy()[groups], mask.numpy())
    assert len(first) == 3  # rows 0 and 2; 1 and 4; row 3 (same ids as row 0, another mask)
    assert distinct_prompts(ids[:2], mask[:2]) is None


def test_prompts_prefilled_together_give_the_tokens_of_prompts_prefilled_alone():
    """generate's prefill_together: one padded forward for the prompts that start together (and a shared prompt
    once), each row's keys and values moved to its slot; the same tokens, log-probs to float rounding."""
    model = smollm2_shaped()
    rows = prompts(5, seed=2, vocab=model.config.vocab_size) + prompts(1, seed=2, vocab=model.config.vocab_size)
    outs = []
    for together in (False, True):
        engine = DecodeEngine(model, len(rows), 40, prefill_together=together)
        seqs = [DecodeSequence(r, GenerationConfig(max_new_tokens=6, do_sample=False), 40) for r in rows]
        for seq in seqs:
            engine.add(seq)
        while engine.busy():
            engine.step()
        outs.append(([s.turn for s in seqs], np.array([s.turn_log_probs for s in seqs])))
    assert outs[0][0] == outs[1][0] and outs[1][0][0] == outs[1][0][5]  # row 5 repeats row 0's prompt
    np.testing.assert_allclose(outs[0][1], outs[1][1], atol=2e-5)
