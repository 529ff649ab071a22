"""Update micro-batches without padding (Rollout.packed; Rollout.trimmed for the pipeline) and grouped by length
(update_order)."""
import numpy as np
import paddle

from alignment.models import LlamaForCausalLM
from alignment.models.score_model import ScoreModel
from alignment.ppo.rollout.rollout import Rollout, critic_values, response_log_probs, update_order

PAD = 3


def rollout():
    """3 rows, prompt width 4 (left-padded, shared padding in column 0), response width 5 (right-padded):
    row 0 truncated (all 5 tokens), row 1 ends with eos == pad after 2 tokens, row 2 an empty response."""
    ids = paddle.to_tensor([[PAD, PAD, 11, 12, 21, 22, 23, 24, 25],
                            [PAD, 13, 14, 15, 26, PAD, PAD, PAD, PAD],
                            [PAD, PAD, PAD, 16, PAD, PAD, PAD, PAD, PAD]])
    attention = paddle.to_tensor([[0, 0, 1, 1, 1, 1, 1, 1, 1],
                                  [0, 1, 1, 1, 1, 1, 0, 0, 0],
                                  [0, 0, 0, 1, 0, 0, 0, 0, 0]])
    response = paddle.to_tensor([[1.0, 1, 1, 1, 1], [1, 1, 0, 0, 0], [0, 0, 0, 0, 0]])
    per_token = paddle.arange(15, dtype="float32").reshape([3, 5])
    return Rollout(ids, attention, response, 4, ["a", "b", "c"], ["x", "y", ""], {}, old_log_probs=per_token,
                   advantages=per_token * 2, end_rewards=paddle.to_tensor([1.0, 2.0, 3.0]))


def test_trimming_drops_only_columns_that_are_padding_in_every_row():
    full = rollout()
    trimmed = full.trimmed()  # all rows: column 0 is padding; truncated row 0 keeps all 5 response columns
    assert trimmed.prompt_len == 3 and trimmed.input_ids.shape == [3, 8]
    np.testing.assert_array_equal(trimmed.input_ids.numpy(), full.input_ids.numpy()[:, 1:])
    short = full.select(paddle.to_tensor([1, 2])).trimmed()  # eos == pad row and empty row: 2 response columns
    assert short.prompt_len == 3 and short.response_mask.shape == [2, 2]
    np.testing.assert_array_equal(short.input_ids.numpy(), full.input_ids.numpy()[1:, 1:6])
    np.testing.assert_array_equal(short.old_log_probs.numpy(), [[5, 6], [10, 11]])
    np.testing.assert_array_equal(short.advantages.numpy(), [[10, 12], [20, 22]])
    np.testing.assert_array_equal(short.end_rewards.numpy(), [2, 3])  # per-row fields untouched
    empty = full.select(paddle.to_tensor([2])).trimmed()  # all-masked response: one column stays
    assert empty.prompt_len == 1 and empty.response_mask.shape == [1, 1] and empty.input_ids.shape == [1, 2]


def test_trimmed_rows_give_the_same_log_probs_and_values(tiny_model_dir, tiny_reward_dir):
    actor = LlamaForCausalLM.from_pretrained(tiny_model_dir)
    critic = ScoreModel.from_pretrained(tiny_reward_dir)
    full = rollout().select(paddle.to_tensor([1, 2]))
    short = full.trimmed()
    a, _ = response_log_probs(actor, full.input_ids, full.attention_mask, full.prompt_len)
    b, _ = response_log_probs(actor, short.input_ids, short.attention_mask, short.prompt_len)
    mask = short.response_mask.numpy() > 0
    np.testing.assert_allclose(b.numpy()[mask], a.numpy()[:, :2][mask], atol=1e-5)
    v = critic_values(critic, full.input_ids, full.attention_mask, full.prompt_len)
    w = critic_values(critic, short.input_ids, short.attention_mask, short.prompt_len)
    np.testing.assert_allclose(w.numpy()[mask], v.numpy()[:, :2][mask], atol=1e-5)


def test_length_grouped_order_is_a_permutation_of_similar_length_units():
    lengths = np.array([1, 30, 2, 31, 3, 32, 4, 33])
    order = update_order(np.random.default_rng(0), lengths, 2, group_by_length=True)
    assert sorted(order.tolist()) == list(range(8))
    units = [sorted(lengths[order[i:i + 2]].tolist()) for i in range(0, 8, 2)]
    assert sorted(units) == [[1, 2], [3, 4], [30, 31], [32, 33]]  # neighbours in length share a micro-batch
    plain = update_order(np.random.default_rng(0), lengths, 2, group_by_length=False)
    np.testing.assert_array_equal(plain, np.random.default_rng(0).permutation(8))
    one_unit = update_order(np.random.default_rng(0), lengths, 8, group_by_length=True)
    np.testing.assert_array_equal(one_unit, plain)  # one micro-batch: nothing to group


def test_rows_kept_together_move_as_whole_groups_ordered_by_their_longest_row():
    lengths = np.array([1, 2, 30, 31, 3, 4, 32, 33, 5, 6, 34, 35])  # groups of 2: rows (0, 1), (2, 3), ...
    order = update_order(np.random.default_rng(0), lengths, 4, group_by_length=True, together=2)
    assert sorted(order.tolist()) == list(range(12))
    pairs = order.reshape([-1, 2])
    np.testing.assert_array_equal(pairs[:, 1] - pairs[:, 0], 1)  # whole groups, in their own order
    assert (pairs[:, 0] % 2 == 0).all()
    units = sorted(sorted(lengths[order[i:i + 4]].tolist()) for i in range(0, 12, 4))
    assert units == [[1, 2, 3, 4], [5, 6, 30, 31], [32, 33, 34, 35]]  # similar groups share a micro-batch
    plain = update_order(np.random.default_rng(0), lengths, 4, group_by_length=False, together=2)
    np.testing.assert_array_equal(plain.reshape([-1, 2])[:, 0] // 2, np.random.default_rng(0).permutation(6))


def test_packing_moves_each_row_to_column_zero_and_points_at_its_response():
    packed = rollout().packed()
    # row 0: prompt 11 12 + 5 response tokens (truncated) = 7; row 1: 13 14 15 + 26, eos == pad = 5; row 2: 16
    assert packed.input_ids.shape == [3, 7] and packed.response_mask.shape == [3, 5]
    np.testing.assert_array_equal(packed.attention_mask.numpy(), [[1] * 7, [1] * 5 + [0] * 2, [1] + [0] * 6])
    np.testing.assert_array_equal(packed.input_ids.numpy()[0], [11, 12, 21, 22, 23, 24, 25])
    np.testing.assert_array_equal(packed.input_ids.numpy()[1, :5], [13, 14, 15, 26, PAD])
    assert packed.input_ids.numpy()[2, 0] == 16
    np.testing.assert_array_equal(packed.response_index.numpy(), [[2, 3, 4, 5, 6], [3, 4, 5, 6, 6], [1, 2, 3, 4, 5]])
    np.testing.assert_array_equal(packed.old_log_probs.numpy(), rollout().old_log_probs.numpy())
    short = rollout().select(paddle.to_tensor([1, 2])).packed()  # eos == pad row and the empty response
    assert short.input_ids.shape == [2, 5] and short.response_mask.shape == [2, 2]


def test_packed_rows_give_the_same_log_probs_and_values(tiny_model_dir, tiny_reward_dir):
    actor = LlamaForCausalLM.from_pretrained(tiny_model_dir)
    critic = ScoreModel.from_pretrained(tiny_reward_dir)
    full = rollout()
    packed = full.packed()
    a, _ = response_log_probs(actor, full.input_ids, full.attention_mask, full.prompt_len)
    b, _ = response_log_probs(actor, packed.input_ids, packed.attention_mask, packed.prompt_len,
                              response_index=packed.response_index)
    mask = full.response_mask.numpy() > 0
    np.testing.assert_allclose(b.numpy()[mask], a.numpy()[mask], atol=1e-5)
    v = critic_values(critic, full.input_ids, full.attention_mask, full.prompt_len)
    w = critic_values(critic, packed.input_ids, packed.attention_mask, packed.prompt_len, packed.response_index)
    np.testing.assert_allclose(w.numpy()[mask], v.numpy()[mask], atol=1e-5)


def test_a_sampled_rollouts_response_mask_ends_at_each_rows_first_eos(tiny_model_dir):
    """sample_rollout's response mask is 1 up to and including each row's first end token and 0 on the padding
    after it (eos is half the vocabulary here, so rows end early, at different lengths)."""
    from alignment.models import GenerationConfig, Tokenizer
    from alignment.ppo.rollout.rollout import sample_rollout

    actor, tokenizer = LlamaForCausalLM.from_pretrained(tiny_model_dir), Tokenizer.from_pretrained(tiny_model_dir)
    ends = list(range(0, actor.config.vocab_size, 2))
    config = GenerationConfig(max_new_tokens=8, do_sample=True, temperature=1.0, eos_token_id=ends,
                              pad_token_id=tokenizer.pad_token_id)
    prompts = [[5, 6, 7], [8, 9]]

    def collate(items):
        width = max(len(item["input_ids"]) for item in items)
        return {"input_ids": [[tokenizer.pad_token_id] * (width - len(i["input_ids"])) + i["input_ids"] for i in items],
                "attention_mask": [[0] * (width - len(i["input_ids"])) + [1] * len(i["input_ids"]) for i in items]}

    paddle.seed(1)
    out = sample_rollout(actor, tokenizer, [{"prompt": str(p), "input_ids": p} for p in prompts], config, 4, collate)
    responses, mask = out.input_ids.numpy()[:, out.prompt_len:], out.response_mask.numpy()
    lengths = []
    for row, ids in enumerate(responses):
        stop = next((t for t, token in enumerate(ids) if token in ends), len(ids) - 1)
        np.testing.assert_array_equal(mask[row], [1.0] * (stop + 1) + [0.0] * (len(ids) - stop - 1))
        lengths.append(stop + 1)
    assert len(set(lengths)) > 1 and min(lengths) < 8  # rows did end early, at different lengths
