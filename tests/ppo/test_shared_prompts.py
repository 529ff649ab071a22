"""Micro-batches whose rows repeat a prompt (GRPO's groups) run each prompt once (Rollout.micro_batch,
LlamaModel.forward_sharing_prompts): the same log-probs, entropies and gradients as every row running its own."""
import numpy as np
import paddle
import pytest

from alignment.models import LlamaForCausalLM
from alignment.ppo.rollout.rollout import Rollout, response_log_probs

PAD = 3
PROMPTS = {"a": [11, 12], "b": [13, 14, 15], "c": [16]}  # widths 2, 3, 1: left padding differs per prompt


def rollout(names, responses):
    """Rows prompt names[i] (left-padded to 4 columns, a shared padding column) + responses[i] (right-padded to
    5 columns with PAD; a response of 5 tokens is truncated, a shorter one ends with eos == pad)."""
    ids, mask, response_mask = [], [], []
    for name, response in zip(names, responses):
        prompt = PROMPTS[name]
        ids.append([PAD] * (4 - len(prompt)) + prompt + response + [PAD] * (5 - len(response)))
        mask.append([0] * (4 - len(prompt)) + [1] * (len(prompt) + len(response)) + [0] * (5 - len(response)))
        response_mask.append([1.0] * len(response) + [0.0] * (5 - len(response)))
    n = len(names)
    return Rollout(paddle.to_tensor(ids), paddle.to_tensor(mask), paddle.to_tensor(response_mask), 4, list(names),
                   [""] * n, {}, old_log_probs=paddle.zeros([n, 5]))


NAMES = ["a", "b", "a", "a", "c", "b"]
RESPONSES = [[21, 22, 23, 24, 25], [26, PAD], [27, 28, 29], [], [30, 31, 32, 33, 34], [26, 35, 36, 37]]


def partition(groups):
    return sorted(sorted(np.flatnonzero(groups == g).tolist()) for g in set(groups.tolist()))


def test_rows_of_a_repeated_prompt_share_a_group_number():
    full = rollout(NAMES, RESPONSES)
    shared = full.micro_batch(np.arange(6), share_prompts=True)
    assert partition(shared.prompt_groups.numpy()) == [[0, 2, 3], [1, 5], [4]]
    assert sorted(set(shared.prompt_groups.numpy().tolist())) == [0, 1, 2]
    assert shared.response_index is None and shared.prompt_len == 3  # trimmed: the shared padding column dropped
    np.testing.assert_array_equal(shared.input_ids.numpy(), full.input_ids.numpy()[:, 1:])
    picked = full.micro_batch(np.array([4, 1, 5]), share_prompts=True)  # c, b, b
    assert partition(picked.prompt_groups.numpy()) == [[0], [1, 2]]
    distinct = full.micro_batch(np.array([0, 1, 4]), share_prompts=True)  # nothing to share: packed as before
    off = full.micro_batch(np.arange(6), share_prompts=False)
    for batch in (distinct, off):
        assert batch.prompt_groups is None and batch.response_index is not None and batch.prompt_len == 0


def test_a_different_token_under_the_same_padding_is_another_prompt():
    full = rollout(["a", "a"], [[21], [21]])
    ids = full.input_ids.numpy()
    ids[1, 2] = 17  # the same mask, another first token
    full.input_ids = paddle.to_tensor(ids)
    assert full.micro_batch(np.arange(2), share_prompts=True).prompt_groups is None


def test_each_distinct_prompt_runs_once_then_every_row_its_response(tiny_model_dir):
    actor = LlamaForCausalLM.from_pretrained(tiny_model_dir)
    shapes = []
    hook = actor.model.embed_tokens.register_forward_pre_hook(lambda layer, inputs: shapes.append(inputs[0].shape))
    batch = rollout(NAMES, RESPONSES).micro_batch(np.arange(6), share_prompts=True)
    response_log_probs(actor, batch.input_ids, batch.attention_mask, batch.prompt_len,
                       prompt_groups=batch.prompt_groups)
    hook.remove()
    assert shapes == [[3, 3], [6, 5]]  # prompts a, b, c (3 columns after trimming); then the 5 response columns


def parameters_grads(model):
    return {name: p.grad.numpy().copy() for name, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("recompute", [False, True])
def test_a_shared_prompt_gives_each_row_its_own_log_probs_entropies_and_gradients(tiny_model_dir, recompute):
    actor = LlamaForCausalLM.from_pretrained(tiny_model_dir)
    actor.config.recompute = recompute
    actor.train()
    full = rollout(NAMES, RESPONSES)
    results = []
    for share in (False, True):
        batch = full.micro_batch(np.arange(6), share)
        assert (batch.prompt_groups is not None) == share
        log_probs, entropy = response_log_probs(actor, batch.input_ids, batch.attention_mask, batch.prompt_len, 0.7,
                                                with_entropy=True, response_index=batch.response_index,
                                                entropy_grad=True, prompt_groups=batch.prompt_groups)  # [6, 5]
        mask = batch.response_mask
        ((log_probs * mask).sum() + 0.1 * (entropy * mask).sum()).backward()
        results.append((log_probs.numpy() * mask.numpy(), entropy.numpy() * mask.numpy(), parameters_grads(actor)))
        actor.clear_gradients()
    (lp_row, ent_row, grads_row), (lp_shared, ent_shared, grads_shared) = results
    assert np.abs(lp_row).min(axis=1)[[0, 1, 2, 4, 5]].max() > 0  # real log-probs, not masked zeros
    np.testing.assert_allclose(lp_shared, lp_row, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(ent_shared, ent_row, rtol=1e-5, atol=1e-5)
    assert grads_shared.keys() == grads_row.keys() and len(grads_row) == len(list(actor.parameters()))
    for name, grad in grads_row.items():
        # float32 rounding, as tests/split_invariance.py's assert_matches: within 1e-5 of the tensor's largest entry
        np.testing.assert_allclose(grads_shared[name], grad, rtol=0, atol=1e-5 * np.abs(grad).max(), err_msg=name)
