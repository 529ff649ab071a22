"""Training on multi-turn episodes: GAE and returns step over environment tokens, per-turn rewards land on their
turns, environment tokens never reach a loss, the ids trained are the ids sampled, episodes do not depend on how a
batch is split, and whole runs (PPO and GRPO with a user environment from a file) log env/* and resume exactly."""
import json
import os
import signal
import subprocess
import sys

import numpy as np
import paddle
import pytest
from safetensors.numpy import load_file

from alignment.commands import judge_policy, show_generations
from alignment.config.environment import EnvironmentArguments
from alignment.envs import Environment, StepResult
from alignment.models import GenerationConfig, LlamaForCausalLM, Tokenizer
from alignment.ppo.rl_math import algorithms as rl
from alignment.ppo import run_ppo
from alignment.ppo.rl_math.estimators import token_rewards
from alignment.config.ppo import PPOArguments
from alignment.ppo.rl_math.objective import actor_objective
from alignment.ppo.rollout.rollout import response_log_probs
from alignment.ppo.rollout.samplers import Draw, Episodes
from tests.helpers import GUESS, REPO, read_metrics, run_args



class Echo(Environment):
    """Answers every turn with "again (k)" and reward k; never ends by itself."""
    NAME = "test-echo-training"

    def reset(self, row):
        self.k = 0
        return [{"role": "user", "content": row["input"]}]

    def step(self, assistant_message):
        self.k += 1
        return StepResult([{"role": "user", "content": f"again ({self.k})"}], float(self.k), False)


def test_gae_passes_values_and_advantages_over_environment_tokens():
    # one row: policy tokens at 0, 1, then an observation at 2, 3, then policy tokens at 4; padding at 5
    mask = paddle.to_tensor([[1.0, 1.0, 0.0, 0.0, 1.0, 0.0]])
    values = paddle.to_tensor([[0.5, 0.25, 9.0, 9.0, 1.0, 7.0]])  # 9 and 7 sit where no step is: never read
    rewards = paddle.to_tensor([[0.0, 0.0, 5.0, 5.0, 2.0, 3.0]])
    gamma, lam = 0.9, 0.5
    advantages, returns = rl.compute_gae(values, rewards, mask, gamma, lam)
    a4 = 2.0 - 1.0  # delta_4 = r_4 + gamma * 0 - V_4
    a1 = (0.0 + gamma * 1.0 - 0.25) + gamma * lam * a4  # the next step after token 1 is token 4
    a0 = (0.0 + gamma * 0.25 - 0.5) + gamma * lam * a1
    np.testing.assert_allclose(advantages.numpy(), [[a0, a1, 0, 0, a4, 0]], rtol=1e-6)
    np.testing.assert_allclose(returns.numpy(), [[a0 + 0.5, a1 + 0.25, 0, 0, a4 + 1.0, 0]], rtol=1e-6)
    # a contiguous block is unchanged by the observation-skipping rule (single-turn results stay bitwise)
    block = paddle.to_tensor([[0.0, 1.0, 1.0, 1.0, 0.0]])
    v, r = paddle.to_tensor([[3.0, 0.1, 0.2, 0.3, 4.0]]), paddle.to_tensor([[1.0, 0.0, 0.0, 1.0, 2.0]])
    got, _ = rl.compute_gae(v, r, block, 1.0, 0.95)
    d3 = 1.0 - 0.3
    d2, d1 = 0.3 - 0.2, 0.2 - 0.1
    a3, a2 = d3, d2 + 0.95 * d3
    np.testing.assert_allclose(got.numpy(), [[0, d1 + 0.95 * a2, a2, a3, 0]], rtol=1e-6)


def test_reinforce_returns_to_go_cross_turns_and_per_turn_rewards_land_on_turn_ends():
    mask = paddle.to_tensor([[1.0, 1.0, 0.0, 1.0, 1.0]])
    turn = paddle.to_tensor([[0.0, 0.5, 0.0, 0.0, 0.0]])  # turn 1's reward on its last token (column 1)

    class Scored:  # the fields token_rewards reads
        end_rewards = paddle.to_tensor([2.5])  # reward functions' 2.0 + the turns' 0.5
        turn_rewards = turn
        response_mask = mask
        old_log_probs = ref_log_probs = paddle.zeros([1, 5])

    rewards = token_rewards(Scored, 0.0, "k1")
    np.testing.assert_allclose(rewards.numpy(), [[0, 0.5, 0, 0, 2.0]], rtol=1e-6)  # not 2.5 at the end
    returns, _ = rl.compute_gae(paddle.zeros([1, 5]), rewards, mask, 0.5, 1.0)
    np.testing.assert_allclose(returns.numpy(), [[0.5 * 0.5 + 0.125 * 2, 0.5 + 0.25 * 2, 0, 1.0, 2.0]], rtol=1e-6)


@pytest.mark.parametrize("options", [
    {"kl_in_loss": True, "kl_coeff": 0.1, "kl_estimator": "k3"},
    {"policy_loss_mode": "gspo", "kl_loss_coeff": 0.05, "entropy_coeff": 0.01},
    {"loss_agg_mode": "seq-mean-token-sum-norm", "clip_range_ratio_high": 0.28, "entropy_coeff": 0.01}])
def test_environment_tokens_never_reach_the_policy_or_value_loss(options):
    ppo = PPOArguments(**options)
    mask = paddle.to_tensor([[1.0, 1.0, 0.0, 0.0, 1.0], [1.0, 0.0, 1.0, 1.0, 0.0]])
    rng = np.random.default_rng(0)
    log_probs = paddle.to_tensor(rng.normal(-2, 0.3, [2, 5]).astype("float32"), stop_gradient=False)
    entropy = paddle.to_tensor(rng.uniform(1, 2, [2, 5]).astype("float32"), stop_gradient=False)
    old, ref = (paddle.to_tensor(rng.normal(-2, 0.3, [2, 5]).astype("float32")) for _ in range(2))
    advantages = paddle.to_tensor(rng.normal(0, 1, [2, 5]).astype("float32"))
    def off_mask(scale):  # values added on the observation tokens only
        return paddle.to_tensor(np.where(mask.numpy() > 0, 0.0, rng.normal(0, scale, [2, 5])).astype("float32"))

    losses, grads = [], []
    for extra, shift in ((paddle.zeros([2, 5]), paddle.zeros([2, 5])), (off_mask(50.0), off_mask(5.0))):
        # observations' old / reference log-probs, advantages, current log-probs and entropies changed
        loss, _ = actor_objective(ppo, log_probs + shift, old + extra, advantages + extra, mask, ref + extra,
                                  entropy + shift, 5)
        losses.append(float(loss))
        grads.append([g.numpy() for g in paddle.grad(loss, [log_probs, entropy], allow_unused=True)
                      if g is not None])
    assert np.isfinite(losses).all() and losses[0] == losses[1]
    for clean, dirty in zip(*grads):
        np.testing.assert_array_equal(clean, dirty)
        assert (clean[mask.numpy() == 0] == 0).all()
    values = paddle.to_tensor(rng.normal(0, 1, [2, 5]).astype("float32"))
    clean = rl.critic_loss(values, values * 0.5, values + 1.0, mask, 0.2)
    shifted = rl.critic_loss(values + off_mask(50.0), values * 0.5 + off_mask(50.0), values + 1.0 + off_mask(50.0),
                             mask, 0.2)
    assert float(clean) == float(shifted)


@pytest.fixture(scope="module")
def tiny(tiny_model_dir):
    model = LlamaForCausalLM.from_pretrained(tiny_model_dir)
    model.eval()
    return model, Tokenizer.from_pretrained(tiny_model_dir)


def episodes(max_turns=3, max_tokens=None, **env_options):
    env = EnvironmentArguments(environment="test-echo-training", max_turns=max_turns,
                               max_trajectory_tokens=max_tokens, **env_options)

    class PPO:
        max_new_tokens, min_new_tokens, rollout_decode = 6, 0, "eager"
    return Episodes(PPO, 256, None, env)


def items(n):
    return [{"prompt": f"question {i}", "answer": None, "input_ids": [1]} for i in range(n)]


def test_the_ids_trained_are_the_ids_sampled_and_observations_are_masked(tiny):
    model, tokenizer = tiny
    base = GenerationConfig(max_new_tokens=1, temperature=1.0, eos_token_id=tokenizer.eos_token_id,
                            pad_token_id=tokenizer.pad_token_id)
    rollout = episodes()(model, tokenizer, base, Draw(items(3), 2, seed=11, log_prob_temperature=1.0))
    assert len(rollout) == 6 and all(e["turns"] == 3 for e in rollout.episodes)  # Echo never ends: max_turns
    mask, attention = rollout.response_mask.numpy(), rollout.attention_mask.numpy()[:, rollout.prompt_len:]
    for row, episode in enumerate(rollout.episodes):
        observed = (attention[row] == 1) & (mask[row] == 0)  # tokens after the prompt that are not the policy's
        assert observed.sum() > 0 and episode["turns"] == 3
        # every observation token is in the sequence but out of the loss: "again (1)" and "again (2)" are there
        text = tokenizer.decode(rollout.input_ids.numpy()[row, rollout.prompt_len:][observed].tolist())
        assert "again (1)" in text and "again (2)" in text
    # the trainer's own pass over the rollout's ids gives the sampler's log-probs on every policy token: the
    # sequence trained is the one sampled, token for token (a re-tokenised one would not line up)
    trained, _ = response_log_probs(model, rollout.input_ids, rollout.attention_mask, rollout.prompt_len, 1.0)
    sampled = rollout.old_log_probs.numpy()
    np.testing.assert_allclose(trained.numpy()[mask > 0], sampled[mask > 0], atol=2e-4)
    assert (sampled[mask == 0] == 0).all()


def test_per_turn_rewards_land_on_each_turns_last_token_weighted(tiny):
    """per_turn_rewards: Echo's turn k rewards k; times env_reward_weight 0.5 it sits on the last policy token of
    turn k (where a run of the response mask ends), and nowhere else."""
    model, tokenizer = tiny
    base = GenerationConfig(max_new_tokens=2, temperature=1.0, eos_token_id=tokenizer.eos_token_id,
                            pad_token_id=tokenizer.pad_token_id)
    sampler = episodes(per_turn_rewards=True, env_reward_weight=0.5)
    rollout = sampler(model, tokenizer, base, Draw(items(2), 2, seed=3, log_prob_temperature=1.0))
    mask, rewards = rollout.response_mask.numpy(), rollout.turn_rewards.numpy()
    for row in range(len(rollout)):
        ends = [t for t in range(mask.shape[1]) if mask[row, t] > 0 and (t + 1 == mask.shape[1] or
                                                                          mask[row, t + 1] == 0)]
        assert len(ends) == 3 and list(np.flatnonzero(rewards[row])) == ends, (ends, rewards[row])
        np.testing.assert_allclose(rewards[row, ends], [0.5, 1.0, 1.5])


def test_episodes_do_not_depend_on_how_the_batch_is_split(tiny):
    model, tokenizer = tiny
    base = GenerationConfig(max_new_tokens=1, temperature=1.0, eos_token_id=tokenizer.eos_token_id,
                            pad_token_id=tokenizer.pad_token_id)
    sampler = episodes(max_turns=2)
    whole = sampler(model, tokenizer, base, Draw(items(4), 2, seed=5))
    halves = [sampler(model, tokenizer, base, Draw(items(4)[k: k + 2], 2, positions=[k, k + 1], total=4, seed=5))
              for k in (0, 2)]
    for start, half in zip((0, 4), halves):
        for i, episode in enumerate(half.episodes):
            assert episode["messages"] == whole.episodes[start + i]["messages"]
    other = sampler(model, tokenizer, base, Draw(items(4), 2, seed=6))
    assert [e["messages"] for e in other.episodes] != [e["messages"] for e in whole.episodes]


@pytest.mark.parametrize("estimator", ["gae", "grpo"])
def test_a_user_environment_from_a_file_trains_with_ppo_and_grpo(tmp_path, tiny_model_dir, estimator):
    run_ppo.main(run_args(tmp_path / "out", tiny_model_dir, estimator, "--save_steps", "0"))
    rows = [r for r in read_metrics(tmp_path / "out") if "actor_loss" in r]
    assert len(rows) == 4
    assert all(1 < r["env/turns"] <= 3 for r in rows)  # hints ("Higher.") keep episodes going
    assert all(r["env/reward"] <= 0 and "reward/environment" in r for r in rows)  # wrong guesses cost 0.1 each
    if estimator == "gae":
        assert all(np.isfinite(r["critic_loss"]) for r in rows)
    assert os.path.isfile(tmp_path / "out" / "policy" / "model.safetensors")


def test_the_end_reward_is_the_reward_functions_plus_env_reward_weight_times_the_environments(tmp_path,
                                                                                              tiny_model_dir):
    run_ppo.main(run_args(tmp_path / "out", tiny_model_dir, "grpo", "--max_steps", "2", "--reward_funcs",
                          "sentiment", "--env_reward_weight", "2.0", "--normalize_reward", "false"))
    rows = read_metrics(tmp_path / "out")
    assert all(r["reward/environment"] < 0 and r["reward/environment"] == r["env/reward"] for r in rows)
    for r in rows:  # means of the per-episode sums: sentiment + 2.0 x the environment's (wrong guesses cost 0.1)
        assert r["reward/mean"] == pytest.approx(r["reward/sentiment"] + 2.0 * r["reward/environment"], abs=1e-6)


def test_evaluation_judging_and_the_generations_view_show_whole_episodes(tmp_path, tiny_model_dir, capsys):
    eval_spec = f"prompt-only:0.06:{REPO}/data/reasoning/basic_arithmetic_eval.jsonl"
    run_ppo.main(run_args(tmp_path / "out", tiny_model_dir, "grpo", "--eval_datasets", eval_spec, "--max_steps",
                          "1"))
    evals = [r for r in read_metrics(tmp_path / "out") if "eval/reward" in r]
    assert len(evals) == 2 and all(1 < r["eval/env/turns"] <= 3 for r in evals)
    rows = [json.loads(line) for line in open(tmp_path / "out" / "eval_generations.jsonl")]
    assert all(len(r["messages"]) >= 4 for r in rows)  # prompt, guess, hint, guess (, hint)
    assert all(r["completion"] == [m for m in r["messages"] if m["role"] == "assistant"][-1]["content"]
               for r in rows)
    capsys.readouterr()
    show_generations.main([str(tmp_path / "out"), "--samples", "1"])
    shown = capsys.readouterr().out
    assert "turns" in shown.splitlines()[2] and "[assistant] " in shown and "[user] " in shown
    # the held-out judge plays the same episodes greedily
    means = judge_policy.main(["--model", str(tmp_path / "out" / "policy"), "--prompts", eval_spec, "--judge",
                               "arithmetic", "--environment", "guess-number", "--env-modules", GUESS,
                               "--max-turns", "3", "--max-new-tokens", "6", "--max-length", "128",
                               "--max-trajectory-tokens", "48", "--output", str(tmp_path / "judged.jsonl")])
    judged = [json.loads(line) for line in open(tmp_path / "judged.jsonl")]
    assert means == [0.0] and [r["messages"] for r in judged] == [r["messages"] for r in rows if r["step"] == 1]


KILLER = """import os, signal
from alignment.envs import StepResult
import guess_number_env

RESETS = [0]


class KilledMidBatch(guess_number_env.GuessNumber):
    NAME = "test-guess-killed-mid-batch"

    def reset(self, row):
        RESETS[0] += 1
        marker = os.environ["KILL_MARKER"]
        if RESETS[0] == 9 and os.path.exists(marker):  # the first episode of step 3, after checkpoint-2
            os.remove(marker)
            os.kill(os.getpid(), signal.SIGKILL)
        return super().reset(row)
"""


def test_multi_turn_runs_resume_exactly_after_a_kill_mid_batch(tmp_path, tiny_model_dir):
    (tmp_path / "killer_env.py").write_text(KILLER)
    marker = tmp_path / "kill-once"
    env = {**os.environ, "KILL_MARKER": str(marker),
           "PYTHONPATH": os.pathsep.join([str(tmp_path), os.path.join(REPO, "examples"), REPO])}
    script = os.path.join(REPO, "alignment", "ppo", "run_ppo.py")

    def run(out, *extra):  # every run in a subprocess of its own: the same thread settings for all of them
        args = run_args(out, tiny_model_dir, "gae", "--save_steps", "2", "--environment",
                        "test-guess-killed-mid-batch", "--user_env_modules", str(tmp_path / "killer_env.py"), *extra)
        return subprocess.run([sys.executable, script, *args], cwd=REPO, env=env, capture_output=True, text=True)

    straight, killed = tmp_path / "straight", tmp_path / "killed"
    assert run(straight).returncode == 0
    marker.write_text("")
    stopped = run(killed)  # SIGKILLs itself in step 3's first reset
    assert stopped.returncode == -signal.SIGKILL and not marker.exists()
    assert (killed / "latest").read_text().strip() == "checkpoint-2"
    assert [r["step"] for r in read_metrics(killed) if "actor_loss" in r] == [1, 2]
    assert run(killed, "--resume_from_checkpoint", "auto").returncode == 0
    assert [r["step"] for r in read_metrics(killed) if "actor_loss" in r] == [1, 2, 3, 4]
    without_times = [[{k: v for k, v in row.items() if not k.startswith("time/")} for row in read_metrics(out)]
                     for out in (straight, killed)]
    assert without_times[0] == without_times[1]
    for sub in ("policy", "value"):
        a, b = (load_file(os.path.join(out, sub, "model.safetensors")) for out in (straight, killed))
        for key in a:
            np.testing.assert_array_equal(a[key], b[key], err_msg=f"{sub} {key}")


def test_an_environment_that_breaks_its_api_stops_the_run_in_one_line(tmp_path, tiny_model_dir):
    broken = tmp_path / "broken_env.py"
    broken.write_text("from alignment.envs import Environment\n\n"
                      "class Broken(Environment):\n    NAME = 'test-broken-file'\n\n"
                      "    def reset(self, row):\n        return [{'role': 'user', 'content': 'hi'}]\n\n"
                      "    def step(self, text):\n        return 'not a StepResult'\n")
    out = tmp_path / "out"
    args = run_args(out, tiny_model_dir, "grpo") + ["--environment", "test-broken-file", "--user_env_modules",
                                                    str(broken)]
    done = subprocess.run([sys.executable, os.path.join(REPO, "alignment", "ppo", "run_ppo.py"), *args],
                          capture_output=True, text=True, cwd=REPO)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr[-2000:]
    assert "environment 'test-broken-file': step returned a str" in done.stderr.strip().splitlines()[-1]
    assert not (out / "policy").exists()


def test_multi_turn_arguments_are_checked_before_anything_loads(tmp_path, tiny_model_dir):
    script = os.path.join(REPO, "alignment", "ppo", "run_ppo.py")
    cases = {("--per_turn_rewards", "true"): "per-turn rewards need one of gae, vapo, reinforce_plus_plus",
             ("--environment", "no-such-env"): "'no-such-env' is not a registered environment",
             ("--environment_args", json.dumps({"colour": 1})): "key 'environment_args': environment 'guess-number'",
             ("--rollout_decode", "static"): "key 'rollout_decode' 'static': multi-turn"}
    for flags, message in cases.items():
        done = subprocess.run([sys.executable, script, *run_args(tmp_path / "o", tiny_model_dir, "grpo"), *flags],
                              capture_output=True, text=True, cwd=REPO)
        assert done.returncode == 2 and "Traceback" not in done.stderr, (flags, done.stderr[-1500:])
        assert message in done.stderr, (flags, done.stderr[-600:])


@pytest.mark.parametrize("extra", [("--lora", "true", "--lora_rank", "4"),
                                   ("--offload_level", "freeze_model optimizer train_model"),
                                   ("--dynamic_sampling", "true", "--max_gen_batches", "3")],
                         ids=["lora", "offload", "dynamic-sampling"])
def test_episodes_train_with_lora_offload_and_dynamic_sampling(tmp_path, tiny_model_dir, extra):
    run_ppo.main(run_args(tmp_path / "out", tiny_model_dir, "grpo", "--max_steps", "2", *extra))
    rows = read_metrics(tmp_path / "out")
    assert len(rows) == 2 and all(1 < r["env/turns"] <= 3 for r in rows)  # every step logged its episodes
    if "--dynamic_sampling" in extra:
        assert all(r["dynamic_sampling/gen_batches"] >= 1 for r in rows)
    assert any(r["actor_loss"] != 0.0 for r in rows)
    if "--lora" in extra:  # the adapters trained, the base weights did not
        adapters = load_file(str(tmp_path / "out" / "policy" / "adapter_model.safetensors"))
        assert any(k.endswith("lora_B.weight") and np.abs(v).max() > 0 for k, v in adapters.items())
    else:
        start, end = (load_file(os.path.join(d, "model.safetensors")) for d in (tiny_model_dir,
                                                                                 tmp_path / "out" / "policy"))
        assert any(not np.array_equal(start[k], end[k]) for k in start)


def test_an_environment_gets_every_column_of_its_jsonl_row(tmp_path, tiny_model_dir):
    from alignment.data import MixedRawDataset
    from alignment.data.tokenized import PromptOnlyDataset
    from alignment.ppo.rollout.episodes import environment_row

    data = tmp_path / "rows.jsonl"
    data.write_text(json.dumps({"prompt": "Find it.", "answer": "42", "secret": 7, "tools": ["calculator"]}) + "\n")
    prompts = PromptOnlyDataset(MixedRawDataset(f"prompt-only:1.0:{data}", seed=0),
                                Tokenizer.from_pretrained(tiny_model_dir), 128)
    assert environment_row(prompts[0]) == {"input": "Find it.", "answer": "42", "secret": 7, "tools": ["calculator"]}


def test_the_episode_schedule_and_the_pool_change_no_bit_of_a_run(tmp_path, tiny_model_dir):
    """env_workers 1 with lockstep rounds against the default pool with continuous batching: the same metrics and
    weights (the decode engine's shapes are fixed, so when a row resumes does not change its numbers)."""
    runs = {"continuous": ("--env_workers", "16", "--episode_schedule", "continuous"),
            "lockstep": ("--env_workers", "1", "--episode_schedule", "lockstep")}
    for name, flags in runs.items():
        run_ppo.main(run_args(tmp_path / name, tiny_model_dir, "grpo", "--save_steps", "0", "--max_steps", "2",
                              *flags))
    strip = lambda rows: [{k: v for k, v in r.items() if not k.startswith("time/")} for r in rows]  # noqa: E731
    continuous, lockstep = (strip(read_metrics(tmp_path / name)) for name in runs)
    assert continuous == lockstep and all(r["env/turns"] > 1 for r in continuous)
    a, b = (load_file(os.path.join(tmp_path / name, "policy", "model.safetensors")) for name in runs)
    for key in a:
        np.testing.assert_array_equal(a[key], b[key], err_msg=key)
