"""generate's prompt pass over repeated prompts (alignment/models/shared_prefill.py): each distinct prompt runs
once when the first layer shows that gives the same bits, and the tokens and log-probs are then the bits of every
row running its own prompt."""
import numpy as np
import paddle
import pytest

from alignment.models import GenerationConfig, LlamaConfig, LlamaForCausalLM, generate
from alignment.models import shared_prefill
from alignment.models.generation import SampleRows
from tests.test_model import tiny_model

# SmolLM2-135M's layer shapes (2 of its 30 layers, a small vocabulary): MKL gives their GEMM rows the same bits
# for any row count above 32 (2 threads) or 71 (1 thread) on the AMD EPYC Zen 4 machines these figures are from
SMOLLM2_LAYERS = dict(vocab_size=500, hidden_size=576, intermediate_size=1536, num_hidden_layers=2,
                      num_attention_heads=9, num_key_value_heads=3, initializer_range=0.05)


def repeated_prompts(rng, names, width: int, vocab: int):
    """Left-padded rows (pad id 0) for the prompt names, e.g. "abab": each letter a prompt of its own length."""
    prompts = {name: rng.integers(1, vocab, size=width - 3 * i).tolist() for i, name in enumerate(sorted(set(names)))}
    ids = [[0] * (width - len(prompts[n])) + prompts[n] for n in names]
    mask = [[0] * (width - len(prompts[n])) + [1] * len(prompts[n]) for n in names]
    return paddle.to_tensor(ids, dtype="int64"), paddle.to_tensor(mask, dtype="int64")


def sample_both_ways(model, ids, mask, config):
    rows = SampleRows(paddle.arange(ids.shape[0], dtype="int64"), ids.shape[0])
    outs = []
    for share in (False, True):
        paddle.seed(5)
        outs.append(generate(model, ids, mask, config, rows=rows, log_prob_temperature=0.7, share_prompts=share))
    return outs


def assert_same_bits(a, b):
    np.testing.assert_array_equal(a.sequences.numpy(), b.sequences.numpy())
    np.testing.assert_array_equal(a.response_mask.numpy(), b.response_mask.numpy())
    np.testing.assert_array_equal(a.log_probs.numpy(), b.log_probs.numpy())


def test_rows_are_grouped_by_prompt_ids_and_mask_padding_included():
    ids = paddle.to_tensor([[0, 5, 6], [7, 5, 6], [0, 5, 6], [0, 5, 6], [7, 5, 6]])
    mask = paddle.to_tensor([[0, 1, 1], [1, 1, 1], [0, 1, 1], [1, 1, 1], [1, 1, 1]])
    first, inverse = shared_prefill.distinct_prompts(ids, mask)
    groups = first.numpy()[inverse.numpy()]  # each row's representative row
    np.testing.assert_array_equal(ids.numpy()[groups], ids.numpy())
    np.testing.assert_array_equal(mask.numpy()[groups], mask.numpy())
    assert len(first) == 3  # rows 0 and 2; 1 and 4; row 3 (same ids as row 0, another mask)
    assert shared_prefill.distinct_prompts(ids[:2], mask[:2]) is None


def test_smollm2_shaped_layers_share_the_prompt_pass_with_the_same_tokens_and_log_probs():
    paddle.seed(3)
    model = LlamaForCausalLM(LlamaConfig(**SMOLLM2_LAYERS))
    model.eval()
    ids, mask = repeated_prompts(np.random.default_rng(0), "aaaabbbbcccc", 40, 500)
    config = GenerationConfig(max_new_tokens=6, min_new_tokens=2, temperature=0.7, eos_token_id=[7])
    shared_prefill._VERDICTS.clear()
    unshared, shared = sample_both_ways(model, ids, mask, config)
    assert_same_bits(shared, unshared)
    verdicts = list(shared_prefill._VERDICTS.values())
    interleaved = paddle.to_tensor([0, 4, 8, 1, 5, 9, 2, 6, 10, 3, 7, 11])  # a prompt's rows need not be adjacent
    unshared, shared = sample_both_ways(model, paddle.gather(ids, interleaved), paddle.gather(mask, interleaved),
                                        config)
    assert_same_bits(shared, unshared)
    if verdicts != [True]:  # another CPU's MKL: sharing stays off there, with the bits checked above
        pytest.skip("this CPU's GEMMs give these rows other bits at other row counts: the prompt pass is not shared")


def test_tiny_models_get_the_same_bits_whether_or_not_the_check_lets_them_share():
    model = tiny_model()
    ids, mask = repeated_prompts(np.random.default_rng(1), "aabbbaac", 9, 97)
    config = GenerationConfig(max_new_tokens=8, temperature=0.7)
    unshared, shared = sample_both_ways(model, ids, mask, config)
    assert_same_bits(shared, unshared)


def test_the_check_refuses_rows_that_do_not_match():
    paddle.seed(3)
    model = LlamaForCausalLM(LlamaConfig(**SMOLLM2_LAYERS))
    model.eval()
    ids, mask = repeated_prompts(np.random.default_rng(0), "aabb", 40, 500)
    shared_prefill._VERDICTS.clear()
    with paddle.no_grad():
        wrong = shared_prefill.rows_agree(model, ids, mask, paddle.to_tensor([0, 2]), paddle.to_tensor([1, 1, 0, 0]))
    assert not wrong
