"""DAPO dynamic sampling (alignment/ppo/rollout/dynamic_sampling.py): the accumulation loop on hand-made reward batches
(kept rows, tries, the cut to the target, the max_gen_batches bound), then GRPO runs on the tiny model with rule
rewards that make some groups' rewards all equal, an exact resume, PaddleNLP's grpo file with dynamic_sampling
true, and the refused settings."""
import json
import os

import numpy as np
import paddle
import pytest
from safetensors.numpy import load_file

from alignment.config.parser import ArgumentError, ArgumentParser
from alignment.ppo.rollout import dynamic_sampling as ds
from alignment.ppo import run_ppo
from alignment.ppo.rollout.rollout import Rollout, concat_rollouts
from tests.helpers import REPO, read_metrics
from tests.config.test_paddlenlp_files import PPO_CLASSES, fixture, one_step
from tests.training.test_resume import without_times

GRPO_CONFIG = os.path.join(REPO, "config", "tiny", "grpo_argument.json")
PROMPTS = f"prompt-only:1.0:{REPO}/data/prompts/train.jsonl"
REWARDS = '''
def some_equal(prompts, completions, **labels):
    """Prompts of even length: every answer scores 1 (a group of equal rewards); others: the answer's length."""
    return [1.0 if len(p) % 2 == 0 else float(len(c)) for p, c in zip(prompts, completions)]


def always_spread(prompts, completions, **labels):
    """0, 1, 0, 1, ... by row: every group of an even size has differing rewards."""
    return [float(i % 2) for i in range(len(completions))]


def constant(prompts, completions, **labels):
    return [0.5] * len(completions)
'''


# ---------------------------------------------------------------- the accumulation loop, by hand
def run_batches(batches, group_size, target, max_gen_batches):
    """accumulate() over fixed reward batches; the payload of batch i is i."""
    calls = []

    def draw(attempt):
        calls.append(attempt)
        return attempt, batches[attempt]

    sampled = ds.accumulate(draw, group_size, target, max_gen_batches)
    assert calls == list(range(sampled.gen_batches))
    return sampled, [(payload, rows.tolist()) for payload, rows in sampled.parts]


def test_groups_are_kept_across_generation_batches_and_cut_to_the_target():
    # groups of 2, 3 per batch. batch 0: [1,1] drop | [0,1] keep | [2,2] drop  -> 1 kept
    # batch 1: [0,1] keep | [3,3] drop | [1,0] keep                             -> 3 kept (= target: stop)
    # batch 2 is never drawn
    batches = [[1, 1, 0, 1, 2, 2], [0, 1, 3, 3, 1, 0], [0, 1, 0, 1, 0, 1]]
    sampled, parts = run_batches(batches, 2, 3, 0)
    assert parts == [(0, [2, 3]), (1, [0, 1, 4, 5])]
    assert (sampled.gen_batches, sampled.kept_groups, sampled.spread_groups, sampled.generated_groups) == (2, 3, 3, 6)
    assert sampled.metrics(3) == {"dynamic_sampling/gen_batches": 2.0, "dynamic_sampling/kept_groups_frac": 0.5,
                                  "dynamic_sampling/filled": 1.0, "dynamic_sampling/skipped_update": 0.0}
    # target 2: batch 1 has two groups with spread, only its first is taken (generation order, as verl cuts)
    sampled, parts = run_batches(batches, 2, 2, 0)
    assert parts == [(0, [2, 3]), (1, [0, 1])]
    assert (sampled.kept_groups, sampled.spread_groups, sampled.generated_groups) == (2, 3, 6)
    # every row drawn and not kept, with why (the rollout ledger's dropped rows): each row of a batch exactly once
    assert [(payload, rows.tolist(), why) for payload, rows, why in sampled.dropped] == [
        (0, [0, 1, 4, 5], "no reward spread"), (1, [2, 3], "no reward spread"), (1, [4, 5], "over target")]
    # every group of the first batch has spread: one try, cut to the target of 2 of its 3 groups
    sampled, parts = run_batches([[0, 1, 0, 1, 0, 1]], 2, 2, 0)
    assert parts == [(0, [0, 1, 2, 3])] and sampled.gen_batches == 1


def test_the_bound_stops_with_part_of_the_target_or_nothing():
    batches = [[1, 1, 0, 1, 2, 2], [5, 5, 5, 5, 5, 5], [0, 1, 0, 1, 0, 1]]
    sampled, parts = run_batches(batches, 2, 3, 2)  # 2 tries: one group with spread of 3 wanted
    assert parts == [(0, [2, 3])]
    assert sampled.metrics(3) == {"dynamic_sampling/gen_batches": 2.0, "dynamic_sampling/kept_groups_frac": 1 / 6,
                                  "dynamic_sampling/filled": 1 / 3, "dynamic_sampling/skipped_update": 0.0}
    sampled, parts = run_batches([[5, 5, 5, 5], [7, 7, 7, 7], [0, 1, 0, 1]], 2, 2, 2)  # nothing within 2 tries
    assert parts == [] and sampled.gen_batches == 2
    assert sampled.metrics(2)["dynamic_sampling/skipped_update"] == 1.0
    assert sampled.metrics(2)["dynamic_sampling/filled"] == 0.0
    sampled, parts = run_batches([[5, 5, 5, 5], [7, 7, 7, 7], [0, 1, 0, 1]], 2, 2, 0)  # no bound: the third one
    assert parts == [(2, [0, 1, 2, 3])] and sampled.gen_batches == 3
    sampled, parts = run_batches([[5, 5, 5, 5], [7, 7, 7, 7], [0, 1, 0, 1]], 2, 2, -1)  # negative: no bound too
    assert sampled.gen_batches == 3


def test_a_short_last_batch_and_groups_of_three():
    # groups of 3; batch 1 is an epoch's short last batch (one group)
    batches = [[0, 0, 0, 1, 2, 3], [4, 4, 5], [9, 9, 9, 1, 1, 2]]
    sampled, parts = run_batches(batches, 3, 3, 0)
    assert parts == [(0, [3, 4, 5]), (1, [0, 1, 2]), (2, [3, 4, 5])]
    assert (sampled.gen_batches, sampled.kept_groups, sampled.generated_groups) == (3, 3, 5)
    with pytest.raises(ValueError, match="num_return_sequences=3"):
        run_batches([[0, 1, 2, 3]], 3, 1, 0)


def test_generation_seeds_are_the_plain_ones_first_then_distinct_and_repeatable():
    assert ds.generation_seed(42, 0, 0) == 42 + 1_000_003 and ds.generation_seed(42, 6, 0) == 42 + 7 * 1_000_003
    seeds = {ds.generation_seed(42, step, attempt) for step in range(20) for attempt in range(6)}
    assert len(seeds) == 120
    assert ds.generation_seed(42, 3, 2) == ds.generation_seed(42, 3, 2) != ds.generation_seed(43, 3, 2)


def test_kept_rows_of_batches_of_different_widths_join_into_one_rollout():
    pad = 0

    def rollout(prompt_len, ids, response_mask, name):
        ids = paddle.to_tensor(ids, dtype="int64")
        mask = paddle.to_tensor(np.asarray(ids.numpy() != pad, dtype="int64"))
        n = ids.shape[0]
        return Rollout(ids, mask, paddle.to_tensor(response_mask, dtype="float32"), prompt_len,
                       [f"{name}{i}" for i in range(n)], [f"c{name}{i}" for i in range(n)],
                       {"answer": [f"a{name}{i}" for i in range(n)]},
                       end_rewards=paddle.arange(n, dtype="float32"))

    a = rollout(2, [[0, 5, 7, 8], [6, 5, 9, 0]], [[1, 1], [1, 0]], "a")  # P 2, R 2
    b = rollout(3, [[4, 4, 4, 7, 8, 9], [0, 0, 4, 9, 0, 0]], [[1, 1, 1], [1, 0, 0]], "b")  # P 3, R 3
    joined = concat_rollouts([a.take([1]), b.take([0, 1])], pad)
    assert joined.prompt_len == 3 and joined.response_index is None
    np.testing.assert_array_equal(joined.input_ids.numpy(), [[0, 6, 5, 9, 0, 0], [4, 4, 4, 7, 8, 9],
                                                             [0, 0, 4, 9, 0, 0]])
    np.testing.assert_array_equal(joined.attention_mask.numpy(), [[0, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 1],
                                                                  [0, 0, 1, 1, 0, 0]])
    np.testing.assert_array_equal(joined.response_mask.numpy(), [[1, 0, 0], [1, 1, 1], [1, 0, 0]])
    np.testing.assert_array_equal(joined.end_rewards.numpy(), [1, 0, 1])
    assert joined.prompts == ["a1", "b0", "b1"] and joined.completions == ["ca1", "cb0", "cb1"]
    assert joined.labels == {"answer": ["aa1", "ab0", "ab1"]} and joined.old_log_probs is None


def test_the_settings_dynamic_sampling_cannot_run_are_refused():
    base = {"actor_model_name_or_path": "m", "reward_funcs": ["sentiment"], "train_datasets": "x",
            "dynamic_sampling": True}
    for extra, fragment in (({"advantage_estimator": "gae", "num_return_sequences": 4}, "critic-free"),
                            ({"advantage_estimator": "dr_grpo", "num_return_sequences": 1}, "num_return_sequences")):
        with pytest.raises(ArgumentError, match="dynamic_sampling") as info:
            ArgumentParser(*PPO_CLASSES).parse_dict({**base, **extra})
        assert fragment in str(info.value)
    _, _, ppo, _, _ = ArgumentParser(*PPO_CLASSES).parse_dict({**base, "advantage_estimator": "reinforce_plus_plus",
                                                               "num_return_sequences": 2, "max_gen_batches": 3})
    assert (ppo.dynamic_sampling, ppo.max_gen_batches) == (True, 3)
    with pytest.raises(ValueError, match="'dynamic_sampling' runs with one data-parallel process only .*2 data"):
        ds.check_layout(ppo, 2, False)
    with pytest.raises(ValueError, match="'dynamic_sampling' does not run with pipeline_parallel_degree > 1"):
        ds.check_layout(ppo, 1, True)
    ds.check_layout(ppo, 1, False)


# ---------------------------------------------------------------- GRPO on the tiny model
@pytest.fixture(scope="module")
def rewards_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("rewards") / "ds_rewards.py"
    path.write_text(REWARDS)
    return str(path)


def grpo(out, model, reward, *extra):
    run_ppo.main([GRPO_CONFIG, "--actor_model_name_or_path", model, "--output_dir", str(out), "--disable_tqdm",
                  "--train_datasets", PROMPTS, "--eval_datasets", "", "--max_new_tokens", "6", "--max_steps", "2",
                  "--per_device_prompt_batch_size", "4", "--num_return_sequences", "4", "--save_steps", "0",
                  "--logging_steps", "1", "--reward_funcs", reward, *extra])
    return read_metrics(out)


def drawn(out, step):
    return json.load(open(os.path.join(out, f"checkpoint-{step}", "trainer_state.json")))["drawn"]["prompts"]


def test_grpo_generates_until_the_step_is_full_of_groups_with_differing_rewards(tmp_path, tiny_model_dir,
                                                                               rewards_file):
    rows = grpo(tmp_path / "ds", tiny_model_dir, f"{rewards_file}:some_equal", "--dynamic_sampling", "true",
                "--save_steps", "1", "--max_steps", "3")
    gen = [r["dynamic_sampling/gen_batches"] for r in rows]
    assert max(gen) > 1, gen  # about half the prompts give equal rewards: a step of 4 groups needs a second batch
    assert all(r["dynamic_sampling/filled"] == 1.0 and r["dynamic_sampling/skipped_update"] == 0.0 for r in rows)
    assert all(0 < r["dynamic_sampling/kept_groups_frac"] < 1 for r in rows if r["dynamic_sampling/gen_batches"] > 1)
    assert all(np.isfinite(r["actor_loss"]) and r["reward/std"] > 0 for r in rows)
    assert [drawn(tmp_path / "ds", step) for step in (1, 2)] == [gen[0], gen[0] + gen[1]]  # every batch drawn counts
    start = load_file(f"{tiny_model_dir}/model.safetensors")
    trained = load_file(str(tmp_path / "ds" / "policy" / "model.safetensors"))
    assert max(float(np.abs(trained[k] - start[k]).max()) for k in start) > 0


def test_when_every_group_is_kept_at_once_the_run_is_the_plain_one(tmp_path, tiny_model_dir, rewards_file):
    spec = f"{rewards_file}:always_spread"
    plain = grpo(tmp_path / "plain", tiny_model_dir, spec)
    dynamic = grpo(tmp_path / "dynamic", tiny_model_dir, spec, "--dynamic_sampling", "true")
    assert all(r["dynamic_sampling/gen_batches"] == 1.0 for r in dynamic)
    cut = [{k: v for k, v in r.items() if not k.startswith("dynamic_sampling/")} for r in without_times(dynamic)]
    assert cut == without_times(plain)
    a = load_file(str(tmp_path / "plain" / "policy" / "model.safetensors"))
    b = load_file(str(tmp_path / "dynamic" / "policy" / "model.safetensors"))
    for key in a:
        np.testing.assert_array_equal(a[key], b[key], err_msg=key)


def test_at_the_bound_a_step_trains_on_the_groups_kept_or_makes_no_update(tmp_path, tiny_model_dir, rewards_file):
    rows = grpo(tmp_path / "none", tiny_model_dir, f"{rewards_file}:constant", "--dynamic_sampling", "true",
                "--max_gen_batches", "2", "--save_steps", "1")
    assert all(r["dynamic_sampling/gen_batches"] == 2.0 and r["dynamic_sampling/skipped_update"] == 1.0 and
               r["dynamic_sampling/kept_groups_frac"] == 0.0 and "actor_loss" not in r for r in rows)
    assert drawn(tmp_path / "none", 1) == 2
    start = load_file(f"{tiny_model_dir}/model.safetensors")
    trained = load_file(str(tmp_path / "none" / "policy" / "model.safetensors"))
    for key in start:
        np.testing.assert_array_equal(trained[key], start[key], err_msg=key)  # no update was made
    rows = grpo(tmp_path / "part", tiny_model_dir, f"{rewards_file}:some_equal", "--dynamic_sampling", "true",
                "--max_gen_batches", "1")
    filled = [r["dynamic_sampling/filled"] for r in rows]
    assert min(filled) < 1 and all(f > 0 for f in filled), filled  # part of the 4 groups, and trained on
    assert all(np.isfinite(r["actor_loss"]) for r in rows)


def test_a_resumed_dynamic_sampling_run_repeats_the_straight_one(tmp_path, tiny_model_dir, rewards_file):
    spec, flags = f"{rewards_file}:some_equal", ("--dynamic_sampling", "true", "--max_steps", "4")
    straight = grpo(tmp_path / "straight", tiny_model_dir, spec, *flags, "--save_steps", "2")
    resumed = grpo(tmp_path / "resumed", tiny_model_dir, spec, *flags, "--resume_from_checkpoint",
                   str(tmp_path / "straight" / "checkpoint-2"))
    assert [r["step"] for r in resumed] == [3, 4]
    assert without_times(resumed) == without_times(straight)[2:]
    a = load_file(str(tmp_path / "straight" / "policy" / "model.safetensors"))
    b = load_file(str(tmp_path / "resumed" / "policy" / "model.safetensors"))
    for key in a:
        np.testing.assert_array_equal(a[key], b[key], err_msg=key)


def test_paddlenlps_grpo_file_with_dynamic_sampling_runs_one_step(tmp_path, tiny_model_dir, rewards_file, capsys):
    """The file's max_gen_batches (2) is honoured; its reward server is swapped for a rule reward."""
    run_ppo.main([fixture("grpo_argument.yaml"), "--actor_model_name_or_path", tiny_model_dir, "--use_rm_server",
                  "false", "--reward_funcs", f"{rewards_file}:some_equal", "--train_datasets", PROMPTS,
                  "--eval_datasets", "", "--output_dir", str(tmp_path / "out"), "--tensor_parallel_degree", "1",
                  "--max_steps", "1", "--max_dec_len", "4", "--global_batch_size", "2", "--dynamic_sampling", "true"])
    assert "notice: key 'dynamic_sampling'" not in capsys.readouterr().out
    args = one_step(tmp_path / "out")
    assert (args["dynamic_sampling"], args["max_gen_batches"], args["advantage_estimator"]) == (True, 2, "grpo")
    row = read_metrics(tmp_path / "out")[0]
    assert 1 <= row["dynamic_sampling/gen_batches"] <= 2 and row["dynamic_sampling/filled"] > 0


@pytest.mark.parallel
def test_tensor_parallel_dynamic_sampling_equals_one_process(tmp_path, tiny_model_dir, rewards_file):
    """Two tensor-parallel processes (one data rank) keep the same groups and train the same (pytest -m parallel)."""
    import subprocess
    import sys

    from tests.parallel.test_parallel import launch

    args = [os.path.join(REPO, "alignment", "ppo", "run_ppo.py"), GRPO_CONFIG, "--actor_model_name_or_path",
            tiny_model_dir, "--disable_tqdm", "--train_datasets", PROMPTS, "--eval_datasets", "", "--max_new_tokens",
            "6", "--max_steps", "3", "--per_device_prompt_batch_size", "4", "--save_steps", "0", "--reward_funcs",
            f"{rewards_file}:some_equal", "--dynamic_sampling", "true", "--adam_epsilon", "1.0"]
    subprocess.run([sys.executable, *args, "--output_dir", str(tmp_path / "one")], cwd=REPO, check=True,
                   capture_output=True)
    launch(tmp_path / "logs", [*args, "--tensor_parallel_degree", "2", "--output_dir", str(tmp_path / "tp2")])
    one, tp2 = read_metrics(tmp_path / "one"), read_metrics(tmp_path / "tp2")
    assert max(r["dynamic_sampling/gen_batches"] for r in one) > 1
    for key in ("dynamic_sampling/gen_batches", "dynamic_sampling/kept_groups_frac", "reward/mean", "actor_loss",
                "kl"):
        np.testing.assert_allclose([r[key] for r in tp2], [r[key] for r in one], rtol=1e-5, atol=1e-6, err_msg=key)
    _, logs = launch(tmp_path / "dp-logs", [*args, "--output_dir", str(tmp_path / "dp2")], expect_ok=False)
    assert "key 'dynamic_sampling' runs with one data-parallel process only" in logs
