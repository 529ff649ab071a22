"""Older versions of PaddleNLP's RL argument files (tests/fixtures/paddlenlp/*.<commit>.*, byte for byte; README
there): every key is known, each file parses with only degrees changed, and the qwen GRPO YAML with
`mini_batch_size` (issue 36, item 7) runs one step."""
import os

import pytest

from alignment.config import paddlenlp
from alignment.config.parser import ArgumentError, ArgumentParser, load_argument_file
from tests.config.test_paddlenlp_files import (FIXTURES, PPO_CLASSES, PROMPTS, all_our_keys, fixture, keys_of, one_step,
                                        reward_server, run)  # noqa: F401 (reward_server is a fixture)

VERSIONS = sorted(name for name in os.listdir(FIXTURES) if name.count(".") == 2)  # name.<version>.<ext>
DEGREES = ["--tensor_parallel_degree", "1", "--sharding_parallel_degree", "1", "--sharding", ""]


def test_the_versions_are_there_and_every_key_is_known():
    assert len(VERSIONS) >= 4
    for name in VERSIONS:
        unknown = set(load_argument_file(fixture(name))) - all_our_keys() - set(paddlenlp.TABLE)
        assert not unknown, (name, unknown)


@pytest.mark.parametrize("name", [n for n in VERSIONS if n.startswith("grpo_argument.")])
def test_each_version_parses_and_runs_grpo(name):
    instances = ArgumentParser(*PPO_CLASSES).parse_args([fixture(name), *DEGREES])
    ppo = instances[2]
    assert (ppo.advantage_estimator, ppo.num_return_sequences) == ("grpo", 8)


def test_mini_batch_size_is_the_earlier_global_mini_batch_size():
    _, _, ppo, _, train = ArgumentParser(*PPO_CLASSES).parse_args([fixture("grpo_argument.qwen-32cae05.yaml"),
                                                                   *DEGREES])
    # global_batch_size 2, mini_batch_size 2, rollout_n 8, update_iters 1, per_device_train_batch_size 8: 2 x 8 / 8
    assert (ppo.per_device_prompt_batch_size, train.gradient_accumulation_steps) == (2, 2)
    _, _, _, _, train = ArgumentParser(*PPO_CLASSES).parse_args([fixture("grpo_argument.qwen-32cae05.yaml"),
                                                                 *DEGREES, "--global_mini_batch_size", "4"])
    assert train.gradient_accumulation_steps == 4  # a flag under the newer name replaces the file's older one
    values = {"actor_model_name_or_path": "m", "train_datasets": "x", "reward_funcs": ["gsm8k"], "rollout_n": 8,
              "global_batch_size": 4, "per_device_train_batch_size": 8}
    with pytest.raises(ArgumentError, match="keys '(global_)?mini_batch_size' and '(global_)?mini_batch_size' both"):
        ArgumentParser(*PPO_CLASSES).parse_dict({**values, "mini_batch_size": 2, "global_mini_batch_size": 4})


def test_the_oldest_grpo_config_is_refused_for_its_single_response_groups():
    """llm/alignment/ppo/grpo_config.json asked for grpo with num_return_sequences 1 and a reward_server without
    http:// (PaddleNLP's requests.post fails on it and scores 0): every key is known, the values are refused with
    the reason."""
    with pytest.raises(ArgumentError, match="key 'num_return_sequences' must be >= 2"):
        ArgumentParser(*PPO_CLASSES).parse_args([fixture("grpo_config.alignment-ppo-0eecab8.json"), *DEGREES])
    with pytest.raises(ArgumentError, match="key 'reward_server': '127.0.0.1:8080' is not an http"):
        ArgumentParser(*PPO_CLASSES).parse_args([fixture("grpo_config.alignment-ppo-0eecab8.json"), *DEGREES,
                                                 "--num_return_sequences", "2"])
    ppo = ArgumentParser(*PPO_CLASSES).parse_args([fixture("grpo_config.alignment-ppo-0eecab8.json"), *DEGREES,
                                                   "--num_return_sequences", "2", "--reward_server",
                                                   "http://127.0.0.1:8080"])[2]
    assert ppo.advantage_estimator == "grpo"


def test_the_qwen_grpo_yaml_with_mini_batch_size_runs_one_step(tmp_path, tiny_model_dir, reward_server, capsys):
    from alignment.ppo import run_ppo

    notices = run(run_ppo, [
        fixture("grpo_argument.qwen-32cae05.yaml"), "--actor_model_name_or_path", tiny_model_dir,
        "--reward_server", reward_server, "--train_datasets", PROMPTS, "--eval_datasets", "",
        "--output_dir", str(tmp_path / "out"), "--tensor_parallel_degree", "1", "--max_steps", "1",
        "--max_dec_len", "4", "--report_to", "visualdl"], capsys)  # the file's wandb: an optional extra
    assert {"per_device_rollout_batch_size", "sharding"} <= keys_of(notices)
    args = one_step(tmp_path / "out")
    assert (args["advantage_estimator"], args["gradient_accumulation_steps"]) == ("grpo", 2)
