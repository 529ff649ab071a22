"""The decode engine's cache widths (alignment/models/slot_cache.py): the ladder's rungs, growth that keeps what the
cache holds, and a row's logits the same bits at every rung, so an engine whose cache grows gives the tokens and
log-probs of one kept at its capacity's width, whatever its neighbours make it grow to."""
import numpy as np
import paddle
import pytest

from alignment.models import GenerationConfig
from alignment.models.engine import DecodeEngine, LayerSteps, DecodeSequence
from alignment.models.fused_decode import FusedDecoder
from alignment.models.slot_cache import LADDER_FLOOR, SlotCache, ladder_width
from tests.gemm_rows import needs_rows_their_own
from tests.models.test_engine import smollm2_shaped


def test_ladder_rungs():
    assert ladder_width(0, 97) == 97  # capacity + 1 at most the floor: one width
    assert ladder_width(0, 301) == LADDER_FLOOR == 128
    assert ladder_width(127, 301) == 128  # 127 columns + scratch
    assert ladder_width(128, 301) == 192
    assert ladder_width(255, 301) == 256
    assert ladder_width(256, 301) == 301  # the last rung is capacity + 1
    assert ladder_width(300, 301) == 301


def test_growth_keeps_columns_and_clips_at_capacity():
    cache = SlotCache(layers=1, kv_heads=1, head_dim=2, slots=2, capacity=300, grows=True)
    assert cache.width == 128
    k = paddle.arange(100 * 2, dtype="float32").reshape([1, 1, 100, 2]) + 1
    cache.write(1, [(k, -k)], 0)
    assert cache.width == 128
    cache.lengths[1] = 130
    column, mask, _ = cache.step_inputs(np.array([False, True]))
    assert cache.width == 192 and cache.scratch == 191
    assert column.numpy().tolist() == [191, 130] and mask.shape == [2, 192]
    np.testing.assert_array_equal(cache.k[0][1, :, :100].numpy(), k[0].numpy())
    np.testing.assert_array_equal(cache.v[0][1, :, :100].numpy(), -k[0].numpy())
    assert not cache.k[0][:, :, 130:].numpy().any() and not cache.k[0][0].numpy().any()
    cache.lengths[1] = 298
    columns, _, _ = cache.verify_inputs(np.array([False, True]), 5)
    assert cache.width == 301  # grown to the capacity's width; columns past it go to scratch
    assert columns.numpy()[1].tolist() == [298, 299, 300, 300, 300]


def step_logits(stepper_of, model, width: int, lengths, kv) -> np.ndarray:
    """One decode step of 4 slots holding `lengths` columns of `kv`, in a cache `width` wide."""
    slots = len(lengths)
    cache = SlotCache.for_model(model, slots, width - 1)
    for layer, (k, v) in enumerate(kv):  # [slots, kv_heads, 64, d]
        keep = (np.arange(64)[None, None, :, None] < np.asarray(lengths)[:, None, None, None])
        pad = [(0, 0), (0, 0), (0, width - 64), (0, 0)]
        cache.k[layer] = paddle.to_tensor(np.pad(k * keep, pad))
        cache.v[layer] = paddle.to_tensor(np.pad(v * keep, pad))
    cache.lengths = np.asarray(lengths, "int64")
    column, mask, position = cache.step_inputs(np.ones([slots], bool))
    with paddle.no_grad():
        return stepper_of(model, slots).step(paddle.to_tensor([5, 6, 7, 8]), cache, column, mask, position).numpy()


@pytest.mark.parametrize("stepper_of", [FusedDecoder, lambda model, slots: LayerSteps(model)],
                         ids=["fused", "layers"])
def test_row_logits_same_bits_at_every_rung(stepper_of):
    model = smollm2_shaped()
    cfg = model.config
    rng = np.random.default_rng(0)
    shape = [4, cfg.num_key_value_heads, 64, cfg.head_dim]
    kv = [(rng.standard_normal(shape).astype("float32"), rng.standard_normal(shape).astype("float32"))
          for _ in range(cfg.num_hidden_layers)]
    lengths = [3, 17, 50, 63]
    reference = step_logits(stepper_of, model, 128, lengths, kv)
    for width in (192, 256, 301, 513, 1025):
        np.testing.assert_array_equal(step_logits(stepper_of, model, width, lengths, kv), reference,
                                      err_msg=f"width {width}")


def play(model, rows, capacity=300, fixed_width=False, fused=True, lookup=0):
    """Rows in slots 0.. of one engine, 40 sampled tokens each; -> per row (tokens, log-probs), the final width."""
    config = GenerationConfig(max_new_tokens=40, temperature=0.8, top_p=0.95, prompt_lookup_num_tokens=lookup)
    engine = DecodeEngine(model, 2, capacity, fused=fused, fixed_width=fixed_width)
    seqs = [DecodeSequence(row, config, capacity, rng=np.random.default_rng([4, i])) for i, row in enumerate(rows)]
    for seq in seqs:
        engine.add(seq)
    while engine.busy():
        engine.step()
    return [(seq.turn, seq.turn_log_probs) for seq in seqs], engine.cache.width


@pytest.mark.parametrize("fused", [True, pytest.param(False, marks=needs_rows_their_own)], ids=["fused", "layers"])
def test_growing_cache_gives_the_fixed_widths_bits(fused):
    model = smollm2_shaped()
    rng = np.random.default_rng(1)
    short, long = rng.integers(8, 400, 10).tolist(), rng.integers(8, 400, 170).tolist()
    grown, width = play(model, [short, long], fused=fused)
    assert width == 256  # 170 + 40 columns: grown from 128 by the long neighbour
    fixed, full = play(model, [short, long], fixed_width=True, fused=fused)
    assert full == 301
    assert grown == fixed
    alone, narrow = play(model, [short], fused=fused)
    assert narrow == 128 and alone[0] == grown[0]  # the short row's bits whatever its neighbour grew the cache to


def test_speculative_verify_across_rungs():
    model = smollm2_shaped()
    rng = np.random.default_rng(2)
    motif = rng.integers(8, 400, 6).tolist()
    rows = [motif * 20, rng.integers(8, 400, 12).tolist()]  # 120 tokens that repeat: drafts cross 128 columns
    grown, width = play(model, rows, lookup=4)
    fixed, _ = play(model, rows, fixed_width=True, lookup=4)
    assert width == 192 and grown == fixed


@pytest.mark.parametrize("slots", [10, 12, 20])
def test_a_sequence_has_the_same_bits_in_every_slot(slots):
    """The engine runs a multiple of 8 rows above 8 slots: a sequence's bits do not depend on its slot (with 12 rows,
    MKL rounded rows 8-10 apart from rows 0-7 on an Intel Xeon)."""
    from tests.models.test_engine import play as play_turns, prompts

    model = smollm2_shaped()
    rows = prompts(2)
    reference = play_turns(model, rows, slots=[0, slots - 1])
    for slot in range(1, slots - 1):
        tokens, log_probs = play_turns(model, rows, slots=[slot, slots - 1])
        assert (tokens[0], log_probs[0]) == (reference[0][0], reference[1][0]), f"slot {slot}"


@pytest.mark.parametrize("feeding, lengths", [([True, True, True], [3, 5, 0]), ([True, False, True], [3, 5, 0]),
                                              ([True, True, True], [3, 127, 0])], ids=["all", "one-paused", "full"])
def test_a_step_leaves_the_scratch_column_zero_and_keeps_the_written_ones(feeding, lengths):
    cache = SlotCache(layers=2, kv_heads=1, head_dim=2, slots=3, capacity=127)
    cache.lengths = np.asarray(lengths, "int64")
    feeding = np.asarray(feeding)
    column, _, _ = cache.step_inputs(feeding)
    for t in cache.k + cache.v:  # what a decode step writes: each slot's row at its column
        for slot, c in enumerate(column.numpy()):
            t[slot, :, int(c)] = float(slot + 1)
    cache.after_step(feeding)
    for t in cache.k + cache.v:
        values = t.numpy()
        assert not values[:, :, cache.scratch].any()
        for slot in np.flatnonzero(feeding):
            if lengths[slot] < cache.scratch:
                assert (values[slot, :, lengths[slot]] == slot + 1).all()
    assert cache.lengths.tolist() == [n + f for n, f in zip(lengths, feeding)]
