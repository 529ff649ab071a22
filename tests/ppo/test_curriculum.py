"""The difficulty-aware prompt pool (alignment/ppo/rollout/curriculum.py): the plain stream's order when nothing is set
aside, prompts with equal-reward groups set aside and readmitted when the pool runs short, its state restored
exactly, and a GRPO run with it resuming to the same bits."""
import os
import shutil

import numpy as np
import pytest

from alignment.ppo import run_ppo
from alignment.ppo.rollout.curriculum import PromptPool
from alignment.training.batches import epoch_batches
from tests.helpers import REPO, read_metrics
from tests.training.test_resume import assert_same_weights, without_times


def test_nothing_set_aside_draws_the_plain_stream():
    pool, plain = PromptPool(12, 4, seed=7), epoch_batches(12, 4, seed=7)
    for _ in range(7):  # across the epoch boundary
        np.testing.assert_array_equal(next(pool), next(plain))


def test_equal_reward_groups_set_their_prompts_aside():
    pool = PromptPool(12, 4, seed=0)
    first = next(pool)
    rewards = [1, 1, 1, 1, 1, 0, 0, 0, 0.5, 0.5, 0.5, 0.5, 0, 1, 0, 1]  # groups of 4: flat, spread, flat, spread
    metrics = pool.observe(first.tolist(), rewards, 4)
    assert set(pool.set_aside) == {int(first[0]), int(first[2])}
    assert pool.set_aside[int(first[2])] == 0.5
    assert metrics == {"curriculum/zero_variance_groups": 0.5, "curriculum/set_aside": 2.0, "curriculum/pool": 10.0,
                       "curriculum/readmissions": 0.0}
    later = np.concatenate([next(pool) for _ in range(6)])
    assert int(first[0]) not in later and int(first[2]) not in later
    assert int(first[1]) in later and len(later) == 24  # the others come back in later epochs; batches stay whole


def test_patience_counts_groups_in_a_row():
    pool = PromptPool(8, 2, seed=0, patience=2)
    pool.observe([3, 5], [1, 1, 0, 0], 2)  # both flat: streaks of 1, below the patience
    pool.observe([3, 5], [0, 1, 0, 0], 2)  # 3 had spread this time: its streak starts again
    assert pool.streaks == {3: 0, 5: 2} and pool.set_aside == {5: 0.0}
    pool.observe([3], [1, 1], 2)
    assert set(pool.set_aside) == {5}
    pool.observe([3], [1, 1], 2)
    assert set(pool.set_aside) == {3, 5}


def test_prompts_come_back_when_the_pool_cannot_fill_a_batch():
    pool = PromptPool(6, 4, seed=1)
    pool.observe([0, 1, 2], [0] * 6, 2)
    assert len(pool.set_aside) == 3
    batch = next(pool)  # 3 left for a batch of 4: every prompt returns
    assert len(batch) == 4 and pool.set_aside == {} and pool.readmissions == 1


def test_a_restored_pool_draws_what_the_original_would():
    pool = PromptPool(10, 3, seed=5)
    for _ in range(2):
        batch = next(pool)
        pool.observe(batch.tolist(), [1, 1, 0, 1, 0, 0], 2)
    copy = PromptPool(10, 3, seed=5, state=pool.state_dict())
    for _ in range(6):
        np.testing.assert_array_equal(next(pool), next(copy))
    assert copy.state_dict() == pool.state_dict()


def grpo_args(out, model, *extra):
    return [os.path.join(REPO, "config", "tiny", "grpo_argument.json"), "--actor_model_name_or_path", model,
            "--output_dir", str(out), "--disable_tqdm", "--reward_funcs", "accuracy", "--gold_judge", "",
            "--train_datasets", f"prompt-only:1.0:{REPO}/data/chain_sum/chain_sum_train.jsonl",
            "--eval_datasets", "", "--max_steps", "4", "--save_steps", "2", "--max_new_tokens", "4",
            "--per_device_prompt_batch_size", "4", "--num_return_sequences", "2", "--per_device_train_batch_size",
            "8", "--logging_steps", "1", "--curriculum", "true", *extra]


def test_grpo_with_a_curriculum_resumes_to_the_same_bits(tiny_model_dir, tmp_path):
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    run_ppo.main(grpo_args(straight, tiny_model_dir))
    rows = read_metrics(straight)
    assert all("curriculum/zero_variance_groups" in row for row in rows)
    assert rows[0]["curriculum/set_aside"] > 0  # the tiny model answers no sum: every group is flat
    resumed.mkdir()
    shutil.copytree(straight / "checkpoint-2", resumed / "checkpoint-2")
    (resumed / "latest").write_text("checkpoint-2\n")
    run_ppo.main(grpo_args(resumed, tiny_model_dir, "--resume_from_checkpoint", "auto"))
    assert without_times(read_metrics(resumed)) == without_times(rows[2:])
    assert_same_weights(straight / "policy", resumed / "policy")


@pytest.mark.parametrize("extra,fragment", [
    ({"dynamic_sampling": True}, "set one of them"),
    ({"advantage_estimator": "gae"}, "key 'curriculum' filters groups"),
    ({"advantage_estimator": "reinforce_plus_plus", "num_return_sequences": 1}, "key 'curriculum' filters groups"),
])
def test_curriculum_refuses_what_it_cannot_run_with(extra, fragment):
    from alignment.config.parser import ArgumentParser
    from tests.config.test_paddlenlp_files import PPO_CLASSES

    base = {"actor_model_name_or_path": "m", "reward_funcs": ["accuracy"], "train_datasets": "x",
            "advantage_estimator": "grpo", "num_return_sequences": 4, "curriculum": True}
    with pytest.raises(ValueError, match=fragment):
        ArgumentParser(*PPO_CLASSES).parse_dict({**base, **extra})
