"""PPO / GRPO end to end on the tiny model, the rollout layout, reward plumbing and the user-facing errors."""
import json
import os

import numpy as np
import paddle
import pytest

from alignment.models import LlamaForCausalLM, Tokenizer
from alignment.models.score_model import ScoreModel
from alignment.ppo import run_ppo
from alignment.rewards.scoring import RewardComputer
from alignment.ppo.rollout.rollout import Rollout, critic_values, response_log_probs
from tests.helpers import REPO, read_metrics

PPO_CONFIG = os.path.join(REPO, "config", "tiny", "ppo_argument.json")
GRPO_CONFIG = os.path.join(REPO, "config", "tiny", "grpo_argument.json")
PROMPTS = f"prompt-only:1.0:{REPO}/data/prompts/train.jsonl"


def common(tmp_path, actor, *extra):
    return ["--actor_model_name_or_path", actor, "--output_dir", str(tmp_path / "out"), "--disable_tqdm",
            "--train_datasets", PROMPTS, "--eval_datasets", "", "--max_steps", "2", "--max_new_tokens", "8",
            "--per_device_prompt_batch_size", "4", "--logging_steps", "1", *extra]


def weights(path, cls=LlamaForCausalLM):
    return cls.from_pretrained(path).model.layers[0].self_attn.q_proj.weight.numpy()


def test_ppo_steps_change_actor_and_critic_and_log_the_metrics(tmp_path, tiny_model_dir, tiny_reward_dir):
    run_ppo.main([PPO_CONFIG, *common(tmp_path, tiny_model_dir, "--reward_model_name_or_path", tiny_reward_dir,
                                      "--gold_judge", "combined", "--per_device_train_batch_size", "2")])
    out = tmp_path / "out"
    assert np.abs(weights(str(out / "policy")) - weights(tiny_model_dir)).max() > 0
    assert np.abs(weights(str(out / "value"), ScoreModel) - weights(tiny_reward_dir, ScoreModel)).max() > 0
    rows = read_metrics(out)
    assert [r["step"] for r in rows] == [1, 2]
    for key in ("reward/mean", "kl", "actor_loss", "critic_loss", "entropy", "response_length", "gold_reward/mean",
                "time/generate", "time/train", "clip_frac", "approx_kl", "explained_variance", "truncated"):
        assert all(np.isfinite(r[key]) for r in rows), key
    assert rows[0]["kl"] == 0.0  # the first rollout comes from the reference policy itself
    for row in rows:  # generation speed: the step's response tokens over its generation time
        assert 0 < row["time/generated_tokens_per_s"] < 1e6
    assert json.load(open(out / "args.json"))["advantage_estimator"] == "gae"


def test_old_log_probs_from_the_sampling_pass_are_used_and_their_difference_is_logged(tmp_path, tiny_model_dir,
                                                                                      tiny_reward_dir):
    """rollout_log_probs true: the old log-probs are the sampler's, so the first step's KL to the reference (the
    same weights) is 0 only up to float rounding, and the sampler-vs-trainer difference is logged every step
    (max >= p99 >= 0, within a bound: KV-cache decode and a whole-sequence pass differ by float rounding only)."""
    rows = {}
    for flag in ("false", "true"):
        run_ppo.main([PPO_CONFIG, *common(tmp_path / flag, tiny_model_dir, "--reward_model_name_or_path",
                                          tiny_reward_dir, "--rollout_log_probs", flag)])
        rows[flag] = read_metrics(tmp_path / flag / "out")
    exact, rounded = rows["false"], rows["true"]
    assert exact[0]["kl"] == 0.0 and abs(rounded[0]["kl"]) < 1e-5
    assert not any("rollout/log_prob_diff_max" in r for r in exact)
    for row in rounded:
        assert 0.0 <= row["rollout/log_prob_diff_p99"] <= row["rollout/log_prob_diff_max"] < 1e-4


def test_the_first_update_pass_is_exactly_on_policy(tmp_path, tiny_model_dir, tiny_reward_dir, monkeypatch):
    """Old log-probs recomputed by the trainer: in the first update pass (one optimizer step over 2 micro-batches,
    before any weight changes) every ratio is exactly 1 and nothing clips; the second pass moves off policy."""
    from alignment.ppo import ppo_trainer as trainer

    objective, calls = trainer.actor_objective, []

    def recording(ppo, log_probs, old_log_probs, advantages, mask, *rest):
        loss, stats = objective(ppo, log_probs, old_log_probs, advantages, mask, *rest)
        off = float(paddle.where(mask > 0, (log_probs - old_log_probs).abs(), paddle.zeros_like(log_probs)).max())
        calls.append((off, float(stats["ratio"]), float(stats["clip_frac"])))
        return loss, stats

    monkeypatch.setattr(trainer, "actor_objective", recording)
    run_ppo.main([PPO_CONFIG, *common(tmp_path, tiny_model_dir, "--reward_model_name_or_path", tiny_reward_dir,
                                      "--per_device_train_batch_size", "2", "--gradient_accumulation_steps", "2",
                                      "--update_iters", "2", "--max_steps", "1")])
    assert len(calls) == 4  # 2 passes x 2 micro-batches
    assert calls[:2] == [(0.0, 1.0, 0.0)] * 2
    assert max(off for off, _, _ in calls[2:]) > 0


def test_grpo_with_a_rule_reward_builds_no_critic(tmp_path, tiny_model_dir, capsys):
    run_ppo.main([GRPO_CONFIG, *common(tmp_path, tiny_model_dir, "--reward_funcs", "arithmetic")])
    assert "critic not built" in capsys.readouterr().out
    out = tmp_path / "out"
    assert not (out / "value").exists() and (out / "policy" / "model.safetensors").exists()
    assert all("critic_loss" not in r for r in read_metrics(out))


def expected_advantages(name, seen):
    """The advantages [N, R] the estimator `name` gives a scored rollout, in numpy from its definition."""
    ppo, r, mask = seen["ppo"], seen["rewards"].astype("float64"), seen["mask"] > 0
    if name == "reinforce_plus_plus":  # whitened returns-to-go of -kl_coeff * k3 per token + the score at the end
        d = seen["ref"].astype("float64") - seen["old"]
        rewards = np.where(mask, -ppo.kl_coeff * (np.exp(d) - d - 1), 0.0)
        returns = np.zeros_like(rewards)
        for row in range(len(r)):
            idx = np.flatnonzero(mask[row])
            rewards[row, idx[-1]] += r[row]
            running = 0.0
            for k in idx[::-1]:
                running = rewards[row, k] + ppo.gamma * running
                returns[row, k] = running
        values = returns[mask]
        return np.where(mask, (returns - values.mean()) / np.sqrt(values.var(ddof=1) + 1e-8), 0.0)
    groups = r.reshape(-1, ppo.num_return_sequences)
    centered = groups - groups.mean(axis=1, keepdims=True)
    per_response = {"rloo": centered * groups.shape[1] / (groups.shape[1] - 1), "dr_grpo": centered,
                    "reinforce_baseline": centered / (centered.std(ddof=1) + 1e-6)}[name].reshape(-1)
    return np.where(mask, per_response[:, None], 0.0)


@pytest.mark.parametrize("estimator", ["rloo", "dr_grpo", "reinforce_baseline", "reinforce_plus_plus"])
def test_every_critic_free_estimator_runs_a_step(tmp_path, tiny_model_dir, estimator, monkeypatch):
    """The estimator the key names is the one the step used: its advantages are the definition's on the step's own
    rewards (and log-probs), and they trained the policy."""
    from alignment.ppo.ppo_trainer import PPOTrainer

    compute, seen = PPOTrainer.compute_advantages, {}

    def recording(self, rollout):
        out = compute(self, rollout)
        seen.update(ppo=self.ppo, rewards=rollout.end_rewards.numpy(), mask=rollout.response_mask.numpy(),
                    old=None if rollout.old_log_probs is None else rollout.old_log_probs.numpy(),
                    ref=rollout.ref_log_probs.numpy(), advantages=rollout.advantages.numpy())
        return out

    monkeypatch.setattr(PPOTrainer, "compute_advantages", recording)
    run_ppo.main([GRPO_CONFIG, *common(tmp_path, tiny_model_dir, "--advantage_estimator", estimator,
                                       "--reward_funcs", "sentiment", "--max_steps", "1", "--kl_in_loss", "false")])
    row = read_metrics(tmp_path / "out")[0]
    expected = expected_advantages(estimator, seen)
    assert np.abs(expected).max() > 0.1  # the rewards differ within groups: a wrong estimator shows
    np.testing.assert_allclose(seen["advantages"], expected, rtol=1e-4, atol=1e-5)
    assert row["advantage/mean"] == pytest.approx(float(expected[seen["mask"] > 0].mean()), abs=1e-5)
    assert row["actor_loss"] != 0.0 and row["response_length"] > 0
    assert np.abs(weights(str(tmp_path / "out" / "policy")) - weights(tiny_model_dir)).max() > 0


def test_response_log_probs_and_values_line_up_with_the_response_tokens(tiny_model_dir, tiny_reward_dir):
    actor = LlamaForCausalLM.from_pretrained(tiny_model_dir)
    critic = ScoreModel.from_pretrained(tiny_reward_dir)
    ids = paddle.to_tensor([[0, 5, 6, 7, 8, 9], [4, 5, 6, 10, 11, 0]])  # prompt width 3, response width 3
    mask = paddle.to_tensor([[0, 1, 1, 1, 1, 1], [1, 1, 1, 1, 1, 0]])
    log_probs, _ = response_log_probs(actor, ids, mask, prompt_len=3)
    logits = actor(ids, mask).logits.numpy()
    reference = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    for row in range(2):
        for t in range(3):
            assert abs(log_probs[row, t].item() - reference[row, 2 + t, ids[row, 3 + t].item()]) < 1e-5
    values = critic_values(critic, ids, mask, prompt_len=3)
    np.testing.assert_allclose(values.numpy(), critic(ids, mask).scores.numpy()[:, 2:5], atol=1e-6)


def test_reward_model_with_another_chat_template_gets_retokenized_text(tmp_path, tiny_model_dir, tiny_reward_dir):
    import shutil

    other = tmp_path / "rm_plain"
    shutil.copytree(tiny_reward_dir, other)
    config = json.load(open(other / "tokenizer_config.json"))
    del config["chat_template"]  # falls back to the plain USER:/ASSISTANT: template
    json.dump(config, open(other / "tokenizer_config.json", "w"))
    actor_tok, rm_tok = Tokenizer.from_pretrained(tiny_model_dir), Tokenizer.from_pretrained(str(other))
    model = ScoreModel.from_pretrained(str(other))
    computer = RewardComputer(model, rm_tok, actor_tok)
    assert computer.retokenize
    rollout = Rollout(paddle.zeros([1, 2], "int64"), paddle.ones([1, 2], "int64"), paddle.ones([1, 1]), 1,
                      prompts=["What is 2 + 2?"], completions=["4"], labels={})
    text_ids = rm_tok.encode("BEGINNING OF CONVERSATION: USER: What is 2 + 2? ASSISTANT:4<|im_end|>")
    expected = model(paddle.to_tensor([text_ids])).end_scores.numpy()
    np.testing.assert_allclose(computer.model_scores(rollout).numpy(), expected, atol=1e-6)


def expect_exit(capsys, argv, *fragments):
    with pytest.raises(SystemExit) as info:
        run_ppo.main(argv)
    err = capsys.readouterr().err
    assert info.value.code == 2, err
    for fragment in fragments:
        assert fragment in err, err


def test_bad_arguments_fail_before_anything_is_written(tmp_path, tiny_model_dir, capsys):
    base = [PPO_CONFIG, *common(tmp_path, tiny_model_dir)]
    expect_exit(capsys, base + ["--clip_range_ratio", "0"], "clip_range_ratio")
    expect_exit(capsys, base + ["--advantage_estimator", "grpo", "--num_return_sequences", "1"],
                "num_return_sequences")
    expect_exit(capsys, base + ["--max_length", "12"], "prompt 0", "max_length")
    expect_exit(capsys, base + ["--reward_funcs", "no_such_judge"], "reward_funcs", "no_such_judge")
    expect_exit(capsys, base + ["--rollout_decode", "compiled"], "rollout_decode", "'compiled'")
    expect_exit(capsys, base + ["--reward_model_name_or_path", str(tmp_path / "missing")], "missing",
                "model directory not found")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("body, fragment", [
    ("raise RuntimeError('judge crashed')", "'{spec}' raised RuntimeError: judge crashed"),
    ("return [float('nan')] * len(completions)", "returned nan for sample 0"),
])
def test_broken_reward_functions_are_named_and_nothing_is_written(tmp_path, tiny_model_dir, capsys, body, fragment):
    module = tmp_path / "my_rewards.py"
    module.write_text(f"def score(prompts, completions, **labels):\n    {body}\n")
    spec = f"{module}:score"
    expect_exit(capsys, [GRPO_CONFIG, *common(tmp_path, tiny_model_dir, "--reward_funcs", spec)],
                fragment.format(spec=spec))
    assert not (tmp_path / "out").exists()


def test_grpo_reusing_the_update_log_probs_matches_a_separate_old_log_prob_pass(tmp_path, tiny_model_dir,
                                                                               monkeypatch):
    """One pass, one optimizer step: the update's own detached log-probs are the old ones (no extra forward)."""
    from alignment.ppo.ppo_trainer import PPOTrainer

    args = [GRPO_CONFIG, *common(tmp_path / "reuse", tiny_model_dir, "--reward_funcs", "sentiment",
                                 "--per_device_train_batch_size", "16", "--update_iters", "1")]
    calls = []
    run_ppo.main(args)
    reuse = read_metrics(tmp_path / "reuse" / "out")
    init = PPOTrainer.__init__

    def recompute(self, *a, **k):
        init(self, *a, **k)
        calls.append(self.reuse_update_log_probs)
        self.reuse_update_log_probs = False

    monkeypatch.setattr(PPOTrainer, "__init__", recompute)
    run_ppo.main([*args[:1], *common(tmp_path / "separate", tiny_model_dir, "--reward_funcs", "sentiment",
                                     "--per_device_train_batch_size", "16", "--update_iters", "1")])
    separate = read_metrics(tmp_path / "separate" / "out")
    assert calls == [True]  # the default took the reuse path
    for key in ("actor_loss", "kl", "reward/mean", "entropy"):
        np.testing.assert_allclose([r[key] for r in reuse], [r[key] for r in separate], rtol=1e-4, atol=1e-6,
                                   err_msg=key)
    assert [r["clip_frac"] for r in reuse] == [0.0, 0.0]
    np.testing.assert_allclose(weights(str(tmp_path / "reuse" / "out" / "policy")),
                               weights(str(tmp_path / "separate" / "out" / "policy")), atol=1e-6)


def test_static_rollout_decode_gives_the_eager_run(tmp_path, tiny_model_dir, monkeypatch):
    """rollout_decode static: the compiled decode step sees the weights each update changed (step 2 samples from
    the updated actor), so two steps give the eager run's rollouts, losses and weights."""
    from alignment.models.static_decode import StaticDecoder

    compiled, original = [], StaticDecoder.compiled
    monkeypatch.setattr(StaticDecoder, "compiled", lambda self, *a: compiled.append(a) or original(self, *a))
    runs = {}
    for mode in ("eager", "static"):
        run_ppo.main([GRPO_CONFIG, *common(tmp_path / mode, tiny_model_dir, "--reward_funcs", "sentiment",
                                           "--rollout_decode", mode)])
        runs[mode] = read_metrics(tmp_path / mode / "out")
    assert [r["response_length"] for r in runs["static"]] == [r["response_length"] for r in runs["eager"]]
    for key in ("reward/mean", "kl", "actor_loss"):
        np.testing.assert_allclose([r[key] for r in runs["static"]], [r[key] for r in runs["eager"]], rtol=1e-4,
                                   atol=1e-6, err_msg=key)
    assert len(compiled) > 2 and len(set(compiled)) == 1  # every decode step of both rollouts: one program
    assert runs["eager"][1]["kl"] != 0.0  # step 2 sampled from an actor the first update changed
    np.testing.assert_allclose(weights(str(tmp_path / "static" / "out" / "policy")),
                               weights(str(tmp_path / "eager" / "out" / "policy")), atol=1e-6)


def test_ppo_taking_the_old_values_from_the_critics_update_matches_a_separate_value_pass(tmp_path, tiny_model_dir,
                                                                                        tiny_reward_dir, monkeypatch):
    """The first optimizer step takes the whole rollout: the critic's own forward passes in it give the old values
    (Critic.values_in_update), the advantages follow, and the run trains as with a critic pass before the update."""
    from alignment.ppo.ppo_trainer import PPOTrainer

    def run(name):
        run_ppo.main([PPO_CONFIG, *common(tmp_path / name, tiny_model_dir, "--reward_model_name_or_path",
                                          tiny_reward_dir, "--per_device_train_batch_size", "2",
                                          "--gradient_accumulation_steps", "2", "--update_iters", "2")])
        return read_metrics(tmp_path / name / "out")

    fused, init, calls = run("fused"), PPOTrainer.__init__, []

    def separate_pass(self, *a, **k):
        init(self, *a, **k)
        calls.append(self.critic.values_in_update)
        self.critic.values_in_update = False

    monkeypatch.setattr(PPOTrainer, "__init__", separate_pass)
    separate = run("separate")
    assert calls == [True]  # the default took the fused path
    for key in ("actor_loss", "critic_loss", "explained_variance", "kl", "advantage/mean", "reward/mean"):
        np.testing.assert_allclose([r[key] for r in fused], [r[key] for r in separate], rtol=1e-4, atol=1e-6,
                                   err_msg=key)
    for name, cls, start in (("policy", LlamaForCausalLM, tiny_model_dir), ("value", ScoreModel, tiny_reward_dir)):
        fused, separate = (weights(str(tmp_path / run / "out" / name), cls) for run in ("fused", "separate"))
        moved = np.abs(fused - weights(start, cls)).max()  # Adam turns rounding in a ~0 gradient into ~lr moves
        assert moved > 1e-4 and np.abs(fused - separate).max() <= 0.01 * moved, name
