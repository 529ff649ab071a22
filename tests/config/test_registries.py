"""One registry mechanism (alignment/config/registry.py) for the reward functions too, and the name lists that
used to be typed by hand (PaddleNLP's rl_algorithm, per-turn rewards' estimators) read from the registries."""
import pytest

from alignment.config import ArgumentError, ArgumentParser, PPOArguments, PPODataArguments, PPOModelArguments
from alignment.config import paddlenlp_table
from alignment.config.environment import EnvironmentArguments
from alignment.config.registry import ADVANTAGE_ESTIMATORS, REWARD_FUNCTIONS
from alignment.rewards import judges, rules
from alignment.rewards.functions import load_reward_function

BUILT_IN = {"sentiment": judges.sentiment, "arithmetic": judges.arithmetic, "combined": judges.combined,
            "reasoning_gym": judges.reasoning_gym_accuracy, "accuracy": rules.accuracy,
            "format_reward": rules.format_reward, "gsm8k": rules.gsm8k}


def test_the_names_users_write_in_reward_funcs_find_the_same_functions():
    assert {name: REWARD_FUNCTIONS[name] for name in REWARD_FUNCTIONS.names()} == BUILT_IN
    for name, function in BUILT_IN.items():
        assert load_reward_function(name) is function
    assert sorted(judges.JUDGES) == ["arithmetic", "combined", "reasoning_gym", "sentiment"]  # --judge choices
    assert load_reward_function("tests.config.test_registries:score_length")([], ["ab", "c"]) == [2.0, 1.0]
    with pytest.raises(ValueError, match=r"'sentimnet' is neither a registered reward function \(accuracy, "
                                         r"arithmetic, combined, format_reward, gsm8k, reasoning_gym, sentiment\)"):
        load_reward_function("sentimnet")


def score_length(prompts, completions, **labels):
    return [float(len(text)) for text in completions]


def test_a_reward_function_name_cannot_be_taken_twice():
    with pytest.raises(ValueError, match=r"reward function 'gsm8k' is already registered by alignment\.rewards\.rules"
                                         r"\.gsm8k; cannot register .*test_registries\..*gsm8k"):
        @REWARD_FUNCTIONS.function("gsm8k")
        def gsm8k(prompts, completions, **labels):  # noqa: F811
            return [0.0] * len(completions)
    assert REWARD_FUNCTIONS["gsm8k"] is rules.gsm8k


def test_paddlenlps_rl_algorithms_name_registered_estimators_and_the_key_table_lists_them_all():
    assert set(paddlenlp_table.RL_ALGORITHMS.values()) <= set(ADVANTAGE_ESTIMATORS.names())
    note = paddlenlp_table.TABLE["rl_algorithm"].note
    assert all(f"{name} -> {ours}" in note for name, ours in paddlenlp_table.RL_ALGORITHMS.items())
    assert "vapo -> vapo" in note


def test_per_turn_rewards_name_the_estimators_that_read_token_rewards():
    token_level = ADVANTAGE_ESTIMATORS.names(where=lambda estimator: estimator.token_level_rewards)
    assert {"gae", "vapo", "reinforce_plus_plus"} <= set(token_level) and "grpo" not in token_level
    parser = ArgumentParser(PPOModelArguments, PPODataArguments, PPOArguments, EnvironmentArguments)
    base = {"actor_model_name_or_path": "m", "train_datasets": "d", "reward_funcs": ["sentiment"],
            "environment": "guess-number", "per_turn_rewards": True, "normalize_reward": False}
    with pytest.raises(ArgumentError, match=f"per-turn rewards need one of {', '.join(token_level)}"):
        parser.parse_dict({**base, "advantage_estimator": "grpo", "num_return_sequences": 2})
    for estimator in token_level:  # vapo too
        extra = {"pretrain_critic_steps": 0} if ADVANTAGE_ESTIMATORS[estimator].needs_critic else {}
        parser.parse_dict({**base, "advantage_estimator": estimator, **extra})


def test_the_help_names_every_estimator_that_builds_a_critic():
    import dataclasses

    help_text = next(f for f in dataclasses.fields(PPOArguments) if f.name == "advantage_estimator").metadata["help"]
    assert all(f"{name}'s" in help_text for name in ADVANTAGE_ESTIMATORS.names(where=lambda e: e.needs_critic))


def test_only_none_takes_no_policy_gradient_so_distillation_on_other_answers_allows_only_it():
    assert ADVANTAGE_ESTIMATORS.names(where=lambda estimator: not estimator.policy_gradient) == ["none"]


def test_datasets_register_in_the_same_mechanism_with_their_aliases():
    from alignment.config.registry import DATASETS
    from alignment.data import RawDataset

    assert RawDataset.REGISTRY is DATASETS and RawDataset.registered_names() == sorted(DATASETS.classes)
    before = dict(DATASETS.classes)
    try:
        class Pairs(RawDataset):
            NAME = "test-pairs"
            ALIASES = ("test-pairs/train",)
        assert DATASETS["test-pairs"] is Pairs and DATASETS["test-pairs/train"] is Pairs
        with pytest.raises(ValueError, match="dataset 'test-pairs' is already registered by"):
            class Again(RawDataset):
                NAME = "test-other"
                ALIASES = ("test-pairs",)
        assert "test-other" not in DATASETS  # checked before any name registers
        with pytest.raises(ValueError, match="may not contain ':' or ','"):
            class Colon(RawDataset):
                NAME = "data:set"
    finally:
        DATASETS.classes.clear()
        DATASETS.classes.update(before)
