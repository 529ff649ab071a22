"""The registries of what users extend (alignment/config/registry.py): an advantage estimator added as one class
in one file (this one) registers, is validated by the argument parser with its traits, and trains a PPO step on
the tiny model; names are checked against the registries, and a name cannot be taken twice."""
import os

import numpy as np
import pytest

from alignment.config.data import LoRAArguments
from alignment.config.parser import ArgumentError, ArgumentParser
from alignment.config.ppo import PPOArguments, PPODataArguments, PPOModelArguments
from alignment.config.registry import ADVANTAGE_ESTIMATORS, KL_ESTIMATORS, POLICY_LOSSES
from alignment.config.training import TrainingArguments
from alignment.ppo.rl_math import algorithms as rl
from alignment.ppo import run_ppo
from alignment.ppo.rl_math.estimators import AdvantageEstimator
from alignment.ppo.rollout.rollout import Rollout
from tests.golden import close, t
from tests.helpers import REPO, read_metrics

PARSER = (PPOModelArguments, PPODataArguments, PPOArguments, LoRAArguments, TrainingArguments)
BASE = {"actor_model_name_or_path": "m", "train_datasets": "x", "reward_funcs": ["sentiment"]}


class BestOfGroup(AdvantageEstimator):
    """Toy estimator: +1 on every token of the responses with their group's highest reward, 0 elsewhere."""

    NAME = "best_of_group"
    min_group_size = 2
    uses_old_log_probs = False
    calls = []  # the rollout sizes it was asked about

    def __call__(self, rollout, ppo, reduce_sum):
        self.calls.append(len(rollout))
        grouped = rollout.end_rewards.reshape([-1, ppo.num_return_sequences])  # [P, G]
        best = (grouped == grouped.max(axis=1, keepdim=True)).astype("float32").reshape([-1])  # [N]
        return rl.broadcast_sequence_advantages(best, rollout.response_mask), None  # [N, R]


def test_the_toy_estimator_computes_its_golden_advantages():
    ids = t(np.zeros((4, 3))).astype("int64")
    rollout = Rollout(ids, ids, t([[1.0, 1, 0], [0, 1, 1], [1, 0, 0], [1, 1, 1]]), 0, [], [], {},
                      end_rewards=t([0.5, 2.0, -1.0, -3.0]))
    ppo = PPOArguments(advantage_estimator="best_of_group", num_return_sequences=2)
    advantages, returns = ppo.estimator()(rollout, ppo, reduce_sum=None)
    close(advantages, [[0, 0, 0], [0, 1, 1], [1, 0, 0], [0, 0, 0]])  # groups (0.5, 2) and (-1, -3)
    assert returns is None and BestOfGroup.calls[-1] == 4


def test_the_parser_validates_a_registered_estimator_and_its_traits():
    _, _, ppo, _, _ = ArgumentParser(*PARSER).parse_dict(
        {**BASE, "advantage_estimator": "best_of_group", "num_return_sequences": 2})
    assert ppo.estimator is BestOfGroup and not ppo.uses_critic
    with pytest.raises(ArgumentError, match="'num_return_sequences' must be >= 2"):
        ArgumentParser(*PARSER).parse_dict({**BASE, "advantage_estimator": "best_of_group"})
    with pytest.raises(ArgumentError, match=r"'advantage_estimator' must be one of \['gae', .*'best_of_group'\]"):
        ArgumentParser(*PARSER).parse_dict({**BASE, "advantage_estimator": "best_of_groups"})


def test_ppo_trains_a_step_with_the_toy_estimator(tmp_path, tiny_model_dir):
    BestOfGroup.calls.clear()
    run_ppo.main([os.path.join(REPO, "config", "tiny", "grpo_argument.json"),
                  "--actor_model_name_or_path", tiny_model_dir, "--output_dir", str(tmp_path / "out"),
                  "--disable_tqdm", "--train_datasets", f"prompt-only:1.0:{REPO}/data/prompts/train.jsonl",
                  "--eval_datasets", "", "--max_steps", "1", "--max_new_tokens", "8",
                  "--per_device_prompt_batch_size", "4", "--num_return_sequences", "2", "--reward_funcs", "sentiment",
                  "--advantage_estimator", "best_of_group"])
    row = read_metrics(tmp_path / "out")[0]
    assert BestOfGroup.calls == [8]  # 4 prompts x 2 responses, once
    assert np.isfinite(row["actor_loss"]) and row["advantage/mean"] > 0 and "critic_loss" not in row
    assert not (tmp_path / "out" / "value").exists()  # no critic built: the estimator does not need one


def test_the_built_in_names_and_traits():
    assert ADVANTAGE_ESTIMATORS.names(where=lambda e: e.needs_critic) == ["gae", "vapo"]
    assert ADVANTAGE_ESTIMATORS.names(where=lambda e: e.min_group_size == 2)[:2] == ["grpo", "rloo"]
    assert POLICY_LOSSES.names() == ["ppo", "gspo"]
    assert KL_ESTIMATORS.names(where=lambda kl: not kl.loss_only) == ["k1", "k2", "k3"]
    with pytest.raises(ArgumentError, match="'kl_estimator' must be one of \\['k1', 'k2', 'k3'\\], got 'low_var_kl'"):
        ArgumentParser(*PARSER).parse_dict({**BASE, "kl_estimator": "low_var_kl"})


def test_a_name_cannot_be_registered_twice():
    with pytest.raises(ValueError, match="'gae' is already registered by alignment.ppo.rl_math.estimators.GAE"):
        class AnotherGAE(AdvantageEstimator):  # noqa: F841
            NAME = "gae"
    assert ADVANTAGE_ESTIMATORS["gae"].__name__ == "GAE"


def test_vapo_decouples_the_critics_and_the_policys_lambda():
    import math

    import numpy as np
    import paddle

    from alignment.config.ppo import PPOArguments
    from alignment.ppo.rl_math import algorithms as rl
    from alignment.ppo.rl_math.estimators import VAPO

    lengths = paddle.to_tensor([40.0, 10.0, 1.0])
    np.testing.assert_allclose(rl.length_adaptive_lambda(lengths, 0.05).numpy(), [0.5, 0.0, 0.0], atol=1e-7)
    np.testing.assert_allclose(rl.length_adaptive_lambda(paddle.to_tensor([200.0]), 0.05).numpy(), [0.9], rtol=1e-6)

    class Scored:  # two rows of 3 tokens, the second with 2; the rewards at each row's end
        response_mask = paddle.to_tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
        old_values = paddle.to_tensor([[0.2, 0.4, 0.6], [0.1, 0.3, 9.0]])
        end_rewards = paddle.to_tensor([1.0, -1.0])
        old_log_probs = ref_log_probs = paddle.zeros([2, 3])
        turn_rewards = None

    ppo = PPOArguments(advantage_estimator="vapo", kl_coeff=0.0, gamma=1.0, normalize_advantage=False,
                       vapo_length_alpha=0.5)  # lambda = 1 - 1 / (0.5 l): 1/3 for l = 3, 0 for l = 2
    advantages, returns = VAPO()(Scored, ppo, None)
    lam = 1.0 - 1.0 / 1.5
    d = [0.4 - 0.2, 0.6 - 0.4, 1.0 - 0.6]  # row 0's deltas
    a2 = d[2]
    a1 = d[1] + lam * a2
    a0 = d[0] + lam * a1
    np.testing.assert_allclose(advantages.numpy()[0], [a0, a1, a2], rtol=1e-6)
    np.testing.assert_allclose(advantages.numpy()[1], [0.3 - 0.1, -1.0 - 0.3, 0.0], rtol=1e-6)  # lambda 0: TD(0)
    np.testing.assert_allclose(returns.numpy(), [[1.0, 1.0, 1.0], [-1.0, -1.0, 0.0]], rtol=1e-6)  # lambda 1: MC
    assert not math.isclose(float(advantages[0, 0]), 1.0 - 0.2)  # the policy's lambda is not the critic's


def test_the_gae_estimator_puts_the_kl_in_the_reward_unless_it_is_a_loss_term_and_whitens_on_request():
    import paddle

    from alignment.ppo.rl_math.estimators import GAE

    class Scored:  # two rows, the second with 2 tokens; k1 KL = old - ref = [[0.5, 0, 0], [0, 0.5, -]]
        response_mask = paddle.to_tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
        old_values = paddle.to_tensor([[0.2, 0.4, 0.6], [0.1, 0.3, 9.0]])
        end_rewards = paddle.to_tensor([1.0, -1.0])
        old_log_probs = paddle.to_tensor([[-1.0, -1.0, -1.0], [-2.0, -2.0, -2.0]])
        ref_log_probs = paddle.to_tensor([[-1.5, -1.0, -1.0], [-2.0, -2.5, 0.0]])
        turn_rewards = None

    def by_hand(rewards, values, lam=0.5):  # gamma 1: A_t = delta_t + lam A_{t+1}, delta_t = r_t + V_{t+1} - V_t
        out, next_value, next_adv = [0.0] * len(rewards), 0.0, 0.0
        for step in reversed(range(len(rewards))):
            next_adv = rewards[step] + next_value - values[step] + lam * next_adv
            out[step], next_value = next_adv, values[step]
        return out

    with_kl = [by_hand([-0.05, 0.0, 1.0], [0.2, 0.4, 0.6]), by_hand([0.0, -0.05 - 1.0], [0.1, 0.3]) + [0.0]]
    without_kl = [by_hand([0.0, 0.0, 1.0], [0.2, 0.4, 0.6]), by_hand([0.0, -1.0], [0.1, 0.3]) + [0.0]]
    common = dict(advantage_estimator="gae", kl_coeff=0.1, kl_estimator="k1", gamma=1.0, gae_lambda=0.5)
    for kl_in_loss, expected in ((False, with_kl), (True, without_kl)):
        advantages, returns = GAE()(Scored, PPOArguments(**common, kl_in_loss=kl_in_loss,
                                                         normalize_advantage=False), None)
        close(advantages, expected)
        close(returns, np.array(expected) + np.array([[0.2, 0.4, 0.6], [0.1, 0.3, 0.0]]))
    whitened, returns = GAE()(Scored, PPOArguments(**common, normalize_advantage=True), None)
    values = np.array(with_kl[0] + with_kl[1][:2])  # the 5 response tokens
    scaled = (np.array(with_kl) - values.mean()) / np.sqrt(values.var(ddof=1) + 1e-8)
    close(whitened, scaled * Scored.response_mask.numpy(), atol=1e-4)
    close(returns, np.array(with_kl) + np.array([[0.2, 0.4, 0.6], [0.1, 0.3, 0.0]]))  # the critic's: not whitened


def test_vapo_pretrains_the_critic_before_the_policy_moves(tmp_path, tiny_model_dir, tiny_reward_dir):
    import numpy as np
    from safetensors.numpy import load_file

    from alignment.ppo import run_ppo
    from tests.helpers import REPO, read_metrics

    out = tmp_path / "run"
    run_ppo.main([f"{REPO}/config/tiny/ppo_argument.json", "--actor_model_name_or_path", tiny_model_dir,
                  "--reward_model_name_or_path", tiny_reward_dir, "--output_dir", str(out), "--disable_tqdm",
                  "--eval_datasets", "", "--max_steps", "3", "--save_steps", "2", "--max_new_tokens", "6",
                  "--per_device_prompt_batch_size", "4", "--per_device_train_batch_size", "4",
                  "--advantage_estimator", "vapo", "--pretrain_critic_steps", "2", "--logging_steps", "1"])
    start = load_file(f"{tiny_model_dir}/model.safetensors")
    after_two = load_file(str(out / "checkpoint-2" / "policy" / "model.safetensors"))
    final = load_file(str(out / "policy" / "model.safetensors"))
    assert all(np.array_equal(start[k], after_two[k]) for k in start)  # the policy waited two steps
    assert any(not np.array_equal(start[k], final[k]) for k in start)  # and moved in the third
    rows = read_metrics(out)
    assert ["actor_loss" in r for r in rows] == [False, False, True] and all("critic_loss" in r for r in rows)
    critic_start = load_file(f"{tiny_reward_dir}/model.safetensors")
    critic_two = load_file(str(out / "checkpoint-2" / "value" / "model.safetensors"))
    assert any(not np.array_equal(critic_start[k], critic_two[k]) for k in critic_two if k in critic_start)


def test_paddlenlps_rl_algorithm_vapo_runs_vapo():
    args = ArgumentParser(*PARSER).parse_dict({**BASE, "rl_algorithm": "vapo", "pretrain_critic_steps": 5,
                                               "num_return_sequences": 1})
    ppo = next(a for a in args if hasattr(a, "advantage_estimator"))
    assert (ppo.advantage_estimator, ppo.pretrain_critic_steps) == ("vapo", 5)
    with pytest.raises(ArgumentError, match="'pretrain_critic_steps': advantage_estimator 'grpo' has no critic"):
        ArgumentParser(*PARSER).parse_dict({**BASE, "advantage_estimator": "grpo", "num_return_sequences": 2,
                                            "pretrain_critic_steps": 5})
