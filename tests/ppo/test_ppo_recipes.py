"""The DAPO / GSPO / Dr.GRPO recipes wired into PPO's update (alignment/ppo/rl_math/objective.py): the general path
equals the default one where they coincide, per-sequence aggregation is independent of the micro-batch split, the
overlong penalty lands in the reward, masked truncated answers teach nothing, and the entropy bonus has a gradient.
The math itself has golden-value tests in tests/ppo/test_algorithms.py."""
import numpy as np
import paddle
import pytest
from safetensors.numpy import load_file

from alignment.models import LlamaForCausalLM
from alignment.ppo import run_ppo
from tests.helpers import read_metrics
from tests.training.test_resume import ppo_args, without_times


def run(tmp_path, name, model, reward, *flags):
    out = tmp_path / name
    run_ppo.main(ppo_args(out, model, reward, "--max_steps", "2", "--save_steps", "0", "--normalize_reward", "false",
                          *flags))
    return without_times(read_metrics(out)), load_file(str(out / "policy" / "model.safetensors"))


def assert_close(a, b, keys, rtol=1e-5):
    for row_a, row_b in zip(a, b):
        for key in keys:
            np.testing.assert_allclose(row_a[key], row_b[key], rtol=rtol, atol=1e-6, err_msg=key)


def test_the_general_objective_equals_the_default_where_they_coincide(tmp_path, tiny_model_dir, tiny_reward_dir):
    """clip_range_ratio_low = high = clip_range_ratio with token-mean: the same clipped loss, the split statistics."""
    default, w_default = run(tmp_path, "default", tiny_model_dir, tiny_reward_dir)
    general, w_general = run(tmp_path, "general", tiny_model_dir, tiny_reward_dir, "--clip_range_ratio_low", "0.2",
                             "--clip_range_ratio_high", "0.2")
    assert_close(general, default, ("actor_loss", "critic_loss", "reward/mean", "kl", "clip_frac", "approx_kl"))
    assert "clip_frac_high" in general[0] and "clip_frac_high" not in default[0]
    for key in w_default:
        np.testing.assert_allclose(w_general[key], w_default[key], rtol=1e-5, atol=1e-7, err_msg=key)


@pytest.mark.parametrize("mode", ["seq-mean-token-mean", "seq-mean-token-sum-norm"])
def test_per_sequence_aggregation_does_not_depend_on_the_micro_batch_split(tmp_path, tiny_model_dir,
                                                                          tiny_reward_dir, mode):
    """4 rollouts in one micro-batch of 4, or 2 micro-batches of 2: the step's loss is a mean over the same 4
    responses either way (micro-batches weighted by their responses, not their tokens)."""
    flags = ("--loss_agg_mode", mode, "--adam_epsilon", "1.0")
    whole, w_whole = run(tmp_path, "whole", tiny_model_dir, tiny_reward_dir, *flags,
                         "--per_device_train_batch_size", "4", "--gradient_accumulation_steps", "1")
    split, w_split = run(tmp_path, "split", tiny_model_dir, tiny_reward_dir, *flags,
                         "--per_device_train_batch_size", "2", "--gradient_accumulation_steps", "2")
    assert_close(split, whole, ("actor_loss", "reward/mean", "kl"))
    for key in w_whole:
        np.testing.assert_allclose(w_split[key], w_whole[key], rtol=1e-5, atol=1e-6, err_msg=key)


def test_the_overlong_penalty_is_added_to_the_reward(tmp_path, tiny_model_dir, tiny_reward_dir):
    """Step 1 samples the same answers with or without the penalty (sampling is seeded per step)."""
    plain, _ = run(tmp_path, "plain", tiny_model_dir, tiny_reward_dir, "--max_new_tokens", "8")
    shaped, _ = run(tmp_path, "shaped", tiny_model_dir, tiny_reward_dir, "--max_new_tokens", "8",
                    "--enable_overlong_reward_buffer", "true", "--overlong_reward_buffer", "4",
                    "--overlong_penalty_factor", "2.0")
    penalty = shaped[0]["reward/overlong_penalty"]
    assert -2.0 <= penalty < 0  # the tiny random model rarely stops early: most answers run long
    assert shaped[0]["response_length"] == plain[0]["response_length"]
    np.testing.assert_allclose(shaped[0]["reward/mean"], plain[0]["reward/mean"] + penalty, rtol=1e-5, atol=1e-6)


def test_masked_truncated_answers_leave_the_policy_unchanged(tmp_path, tiny_model_dir, tiny_reward_dir):
    """One new token and no end token: every answer is truncated, so no token is in the policy loss."""
    rows, weights = run(tmp_path, "masked", tiny_model_dir, tiny_reward_dir, "--max_new_tokens", "1",
                        "--mask_truncated_responses", "true", "--advantage_estimator", "rloo",
                        "--num_return_sequences", "2", "--per_device_prompt_batch_size", "2")
    assert all(r["truncated"] == 1.0 and r["actor_loss"] == 0.0 for r in rows)
    start = load_file(f"{tiny_model_dir}/model.safetensors")
    for key in start:
        np.testing.assert_array_equal(weights[key], start[key], err_msg=key)


def test_the_entropy_bonus_has_a_gradient(tiny_model_dir):
    model = LlamaForCausalLM.from_pretrained(tiny_model_dir)
    ids = paddle.to_tensor([[5, 6, 7, 8]])
    hidden, _ = model.model(ids)
    _, entropy = model.token_log_probs(hidden[:, :-1], ids[:, 1:], with_entropy=True, entropy_grad=True)
    entropy.sum().backward()
    assert float(model.lm_head.weight.grad.abs().max()) > 0
    _, logged = model.token_log_probs(hidden[:, :-1].detach(), ids[:, 1:], with_entropy=True)
    assert logged.stop_gradient  # without entropy_grad the entropy is a logged statistic only
