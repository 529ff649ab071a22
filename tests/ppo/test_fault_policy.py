"""The rollout fault policy (alignment/ppo/rollout/fault_policy.py): a failed episode is played again with a fresh
environment and a seed of its own, a group whose episode still fails is dropped whole (the other groups' advantages
as if it had never been drawn), the step goes on and counts it, the ledger names it, and too many failed groups
stop the run in one line."""
import json
import os
import signal
import subprocess
import sys
from collections import Counter

import numpy as np
import paddle
import pytest
from safetensors.numpy import load_file

from alignment.commands.replay_ledger import ledger_checks
from alignment.config.environment import EnvironmentArguments
from alignment.config.registry import ADVANTAGE_ESTIMATORS
from alignment.envs import Environment, StepResult
from alignment.models import GenerationConfig, LlamaForCausalLM, Tokenizer
from alignment.ppo import run_ppo
from alignment.ppo.rollout.episodes import environment_rewards
from alignment.ppo.rollout.fault_policy import (RolloutFaultLimit, StepFaults, attempt_seed, drop_failed_groups,
                                        failed_group_indices, intact_rows, play_with_retries)
from alignment.ppo.rollout.ledger import read_ledger
from alignment.ppo.rollout.samplers import Draw, Episodes
from tests.helpers import REPO, read_metrics, run_args


class Outcome:
    def __init__(self, row, attempt, error=None):
        self.row, self.attempt, self.error = row, attempt, error


def test_failed_rows_are_played_again_until_they_work_or_the_retries_run_out():
    calls = []

    def play(rows, attempt):  # row 1 works on its second try, row 3 never; rows 0 and 2 at once
        calls.append((list(rows), attempt))
        return [Outcome(r, attempt, None if r in (0, 2) or (r == 1 and attempt == 1) else "boom") for r in rows]

    results, tries = play_with_retries(play, 4, retries=2)
    assert calls == [([0, 1, 2, 3], 0), ([1, 3], 1), ([3], 2)]
    assert tries == [0, 1, 0, 2]
    assert [r.attempt for r in results] == [0, 1, 0, 2] and [r.error for r in results] == [None, None, None, "boom"]
    _, none = play_with_retries(play, 4, retries=0)
    assert none == [0, 0, 0, 0] and calls[-1] == ([0, 1, 2, 3], 0)


def test_seeds_groups_and_the_limit():
    assert attempt_seed([5, 3], 0) == [5, 3] and attempt_seed([5, 3], 2) == [5, 3, 2] and attempt_seed(None, 1) is None
    assert failed_group_indices([None, "x", None, None, "y", "z"], 2) == [0, 2]
    assert intact_rows(6, 2, [0, 2]) == [2, 3]
    faults = StepFaults()
    faults.add(4, 2, 5, "environment 'e': reset raised OSError: down")
    faults.check(3, 2, 0.5, left=4)  # 2 of 4 is not above 0.5
    faults.add(0, 0, 0, None, episodes=8, failed_episodes=2)
    assert faults.metrics() == {"rollout/failed_groups": 2.0, "rollout/episode_retries": 5.0,
                                "rollout/failed_episodes": 0.25}
    with pytest.raises(RolloutFaultLimit, match=r"^step 3: 2 of 4 prompt groups failed after 2 retries \(key "
                                                r"'episode_retries'\), a fraction of 0\.5 > key "
                                                r"'max_failed_group_fraction' 0\.4; the first: environment 'e'"):
        faults.check(3, 2, 0.4, left=4)
    with pytest.raises(RolloutFaultLimit, match="no group is left to train on"):
        faults.check(3, 2, 0.5, left=0)
    with pytest.raises(RolloutFaultLimit, match="cannot drop a group"):
        faults.check(3, 2, 0.5, left=4, layout_drops="with 2 data-parallel ranks ... cannot drop a group")


class Flaky(Environment):
    """'question 1' fails its first reset of each row (the first two resets), 'question 2' raises in every step
    (a crashed tool); the others end after one turn with a reward read off the text. broken = False: none fail."""
    NAME = "test-flaky-episodes"
    broken = True
    resets = Counter()

    def reset(self, row):
        Flaky.resets[row["input"]] += 1
        if self.broken and row["input"] == "question 1" and Flaky.resets[row["input"]] <= 2:
            raise ConnectionError("game server down")
        self.prompt = row["input"]
        return [{"role": "user", "content": row["input"]}]

    def step(self, assistant_message):
        if self.broken and self.prompt == "question 2":
            raise RuntimeError("tool crashed")
        return StepResult([], float(sum(map(ord, assistant_message)) % 7), True)


@pytest.fixture(scope="module")
def tiny(tiny_model_dir):
    model = LlamaForCausalLM.from_pretrained(tiny_model_dir)
    model.eval()
    return model, Tokenizer.from_pretrained(tiny_model_dir)


def play_flaky(tiny, broken, retries=2):
    model, tokenizer = tiny
    Flaky.broken = broken
    Flaky.resets.clear()
    env = EnvironmentArguments(environment="test-flaky-episodes", max_turns=2, episode_retries=retries)

    class PPO:
        max_new_tokens, min_new_tokens, rollout_decode = 6, 0, "eager"

    base = GenerationConfig(max_new_tokens=1, temperature=1.0, eos_token_id=tokenizer.eos_token_id,
                            pad_token_id=tokenizer.pad_token_id)
    items = [{"prompt": f"question {i}", "answer": None, "input_ids": [1, 5 + i]} for i in range(4)]
    paddle.seed(7)
    rollout = Episodes(PPO, 128, None, env)(model, tokenizer, base, Draw(items, 2, seed=11))
    return rollout, paddle.rand([4]).numpy(), dict(Flaky.resets)


def test_a_failed_episode_is_retried_fresh_and_one_that_keeps_failing_fails_its_group(tiny):
    rollout, after, resets = play_flaky(tiny, broken=True)
    records = rollout.episodes
    assert resets == {"question 0": 2, "question 1": 4, "question 2": 6, "question 3": 2}  # a fresh reset per try
    assert [e["retries"] for e in records] == [0, 0, 1, 1, 2, 2, 0, 0]
    assert all(e["error"] is None for e in records[:4] + records[6:]) and records[2]["turns"] == 1
    assert all(e["error"] == "environment 'test-flaky-episodes': step raised RuntimeError: tool crashed"
               for e in records[4:6])
    assert records[4]["turns"] == 0 and rollout.response_mask.numpy()[4:6].sum() == 0  # the prompt alone
    again, after_again, _ = play_flaky(tiny, broken=True)  # retries are seeded: the same episodes every time
    assert [e["messages"] for e in again.episodes] == [e["messages"] for e in records]
    clean, after_clean, _ = play_flaky(tiny, broken=False)
    # the other rows sample what they sample without faults, and no retry drew from paddle's generator
    for row in (0, 1, 6, 7):
        assert records[row]["messages"] == clean.episodes[row]["messages"]
    np.testing.assert_array_equal(after, after_clean)
    np.testing.assert_array_equal(after, after_again)


@pytest.mark.parametrize("estimator", ["grpo", "rloo"])
def test_group_advantages_of_the_intact_groups_are_those_of_a_run_without_the_failed_group(tiny, estimator):
    rollout, _, _ = play_flaky(tiny, broken=True)
    clean, _, _ = play_flaky(tiny, broken=False)

    class PPO:
        num_return_sequences = 2

    def advantages(r):
        r.end_rewards = paddle.to_tensor(environment_rewards(r).astype("float32"))
        return ADVANTAGE_ESTIMATORS[estimator]()(r, PPO, lambda x: x)[0].numpy().max(axis=1)  # [N]

    kept, dropped, errors = drop_failed_groups(rollout, 2)
    assert dropped == [4, 5] and [e is not None for e in errors] == [False] * 4 + [True] * 2 + [False] * 2
    assert [e["messages"][0]["content"] for e in kept.episodes] == [f"question {i}" for i in (0, 0, 1, 1, 3, 3)]
    without = clean.take([0, 1, 6, 7])  # a draw that never had 'question 2' (or 'question 1', retried otherwise)
    got = advantages(kept)
    assert np.abs(got).sum() > 0
    np.testing.assert_array_equal(got[[0, 1, 4, 5]], advantages(without))


def fails_on_seven(tmp_path):
    (tmp_path / "seven_env.py").write_text(
        "from alignment.envs import Environment, StepResult\n\n"
        "class FailsOnSeven(Environment):\n    NAME = 'test-fails-on-seven'\n\n"
        "    def reset(self, row):\n        if row['answer'] == '7':\n"
        "            raise ConnectionError('game server down')\n"
        "        return [{'role': 'user', 'content': 'Say a number.'}]\n\n"
        "    def step(self, text):\n        return StepResult([], float(len(text) % 3), True)\n")
    with open(tmp_path / "prompts.jsonl", "w") as f:
        for answer in ("3", "5", "7", "9"):
            f.write(json.dumps({"prompt": f"Add up to {answer}.", "answer": answer}) + "\n")
    return ["--environment", "test-fails-on-seven", "--user_env_modules", str(tmp_path / "seven_env.py"),
            "--train_datasets", f"prompt-only:1.0:{tmp_path / 'prompts.jsonl'}", "--max_steps", "2",
            "--save_steps", "0", "--rollout_ledger", "true"]


def test_a_run_drops_the_failed_group_counts_it_and_the_ledger_names_it(tmp_path, tiny_model_dir, capsys):
    out = tmp_path / "out"
    run_ppo.main(run_args(out, tiny_model_dir, "grpo") + fails_on_seven(tmp_path))
    rows = [r for r in read_metrics(out) if "actor_loss" in r]
    assert len(rows) == 2  # the step with the failed group trained on the other one
    assert sorted(r["rollout/failed_groups"] for r in rows) == [0.0, 1.0]
    assert sorted(r["rollout/episode_retries"] for r in rows) == [0.0, 4.0]  # 2 rows x 2 retries
    assert sorted(r["rollout/failed_episodes"] for r in rows) == [0.0, 0.5]
    ledger = read_ledger(str(out))
    dropped = [r for r in ledger if "dropped" in r]
    assert len(dropped) == 2 and all(r["dropped"] == "episode failed" for r in dropped)
    assert all(r["error"] == "environment 'test-fails-on-seven': reset raised ConnectionError: game server down"
               for r in dropped)
    assert len(ledger) - len(dropped) == 6  # 3 prompts x 2 answers trained
    assert all(r["prompt"] != "Add up to 7." for r in ledger if "dropped" not in r)
    assert ledger_checks(ledger) == {"twice": [], "lost_batches": [], "short_batches": []}
    failed_step = next(r["step"] for r in rows if r["rollout/failed_groups"])
    assert {r["step"] for r in dropped} == {failed_step}

    with pytest.raises(SystemExit) as stop:
        run_ppo.main(run_args(tmp_path / "stopped", tiny_model_dir, "grpo") + fails_on_seven(tmp_path)
                     + ["--max_failed_group_fraction", "0.25"])
    assert stop.value.code == 2
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last == (f"error: step {failed_step}: 1 of 2 prompt groups failed after 2 retries (key 'episode_retries'),"
                    f" a fraction of 0.5 > key 'max_failed_group_fraction' 0.25; the first: environment "
                    f"'test-fails-on-seven': reset raised ConnectionError: game server down")


FLAKY_KILLED = """import os, signal
from alignment.envs import Environment, StepResult


class FlakyKilled(Environment):
    ''''7' fails every try (its group is dropped); a turn whose text has a length divisible by 3 crashes the tool
    (its retry samples with its own seed, and mostly works); the first reset after checkpoint-2 is written kills
    the run (once: the marker).'''
    NAME = "test-flaky-killed"

    def reset(self, row):
        marker = os.environ["KILL_MARKER"]
        if os.path.exists(marker) and os.path.exists(os.path.join(os.environ["KILL_OUT"], "checkpoint-2")):
            os.remove(marker)
            os.kill(os.getpid(), signal.SIGKILL)
        if row["answer"] == "7":
            raise ConnectionError("game server down")
        return [{"role": "user", "content": "Say a number."}]

    def step(self, text):
        if len(text) % 3 == 0:
            raise RuntimeError("tool crashed")
        return StepResult([], float(len(text) % 5), True)
"""


def test_a_run_with_retries_and_dropped_groups_resumes_to_the_same_bits(tmp_path, tiny_model_dir):
    fails_on_seven(tmp_path)  # the prompts file
    (tmp_path / "flaky_killed.py").write_text(FLAKY_KILLED)
    marker = tmp_path / "kill-once"
    script = os.path.join(REPO, "alignment", "ppo", "run_ppo.py")

    def run(out, *extra):  # every run in a subprocess of its own: the same thread settings for all of them
        args = run_args(out, tiny_model_dir, "grpo", "--save_steps", "2", "--rollout_ledger", "true",
                        "--environment", "test-flaky-killed", "--user_env_modules", str(tmp_path / "flaky_killed.py"),
                        "--train_datasets", f"prompt-only:1.0:{tmp_path / 'prompts.jsonl'}",
                        "--per_device_prompt_batch_size", "4", "--per_device_train_batch_size", "8", *extra)
        env = {**os.environ, "KILL_MARKER": str(marker), "KILL_OUT": str(out)}
        return subprocess.run([sys.executable, script, *args], cwd=REPO, env=env, capture_output=True, text=True)

    straight, killed = tmp_path / "straight", tmp_path / "killed"
    done = run(straight)
    assert done.returncode == 0, done.stderr[-2000:]
    rows = read_metrics(straight)
    assert len(rows) == 4 and all(r["rollout/failed_groups"] >= 1 for r in rows)  # '7' is in every step
    assert all(r["rollout/episode_retries"] > 4 for r in rows[2:])  # beyond '7's 2 x 2: after the checkpoint too
    marker.write_text("")
    stopped = run(killed)  # SIGKILLs itself in step 3's first reset
    assert stopped.returncode == -signal.SIGKILL and not marker.exists()
    assert run(killed, "--resume_from_checkpoint", "auto").returncode == 0
    without_times = [[{k: v for k, v in row.items() if not k.startswith("time/")} for row in read_metrics(out)]
                     for out in (straight, killed)]
    assert without_times[0] == without_times[1]
    assert read_ledger(str(straight)) == read_ledger(str(killed))
    a, b = (load_file(os.path.join(out, "policy", "model.safetensors")) for out in (straight, killed))
    for key in a:
        np.testing.assert_array_equal(a[key], b[key], err_msg=key)


FAILING_JUDGE = '''def score(prompts, completions, answer=None, **_):
    if "7" in (answer or []):
        raise ValueError("cannot judge a 7")
    return [float(len(c) % 4) for c in completions]
'''


def judged_by_a_failing_service(tmp_path, tiny_model_dir, *extra):
    """A 2-step GRPO run of 4 prompts (2 a step) whose rewards come from a judge server that fails on '7'."""
    from tests.rewards.test_reward_server import Server

    (tmp_path / "judge.py").write_text(FAILING_JUDGE)
    server = Server(tmp_path, "--judge", f"{tmp_path}/judge.py:score", "--max-wait-ms", "0").wait()
    try:
        args = fails_on_seven(tmp_path)
        i = args.index("--environment")
        del args[i + 2: i + 4]  # no seven_env.py: an environment of this module that fails nothing here
        args[i + 1] = "test-flaky-episodes"
        Flaky.broken = False
        run_ppo.main(run_args(tmp_path / "out", tiny_model_dir, "grpo") + args + [
            "--use_rm_server", "true", "--reward_server", server.url, "--reward_server_retries", "0", *extra])
    finally:
        server.stop()
    return tmp_path / "out", server.url


def test_a_group_the_reward_service_fails_on_is_dropped_and_the_others_scored(tmp_path, tiny_model_dir):
    out, url = judged_by_a_failing_service(tmp_path, tiny_model_dir)
    rows = [r for r in read_metrics(out) if "actor_loss" in r]
    assert len(rows) == 2 and sorted(r["rollout/failed_groups"] for r in rows) == [0.0, 1.0]
    assert all(r["rollout/episode_retries"] == 0 for r in rows)  # the episodes themselves never failed
    dropped = [r for r in read_ledger(str(out)) if "dropped" in r]
    assert len(dropped) == 2 and all(r["dropped"] == "reward failed" and "cannot judge a 7" in r["error"]
                                     and url in r["error"] for r in dropped)
    trained = [r for r in read_ledger(str(out)) if "dropped" not in r]
    assert len(trained) == 6 and all(r["prompt"] != "Add up to 7." for r in trained)
    for r in trained:  # the other groups scored by the service, together, after the drop
        assert r["reward_parts"]["model"] in (0.0, 1.0, 2.0, 3.0)
        assert abs(r["reward"] - r["reward_parts"]["model"] - r["reward_parts"]["environment"]) < 1e-5


def test_dynamic_sampling_draws_again_for_a_group_the_reward_service_failed_on(tmp_path, tiny_model_dir):
    out, _ = judged_by_a_failing_service(tmp_path, tiny_model_dir, "--dynamic_sampling", "true", "--max_gen_batches",
                                         "3")
    rows = read_metrics(out)
    assert [(r["rollout/failed_groups"], r["dynamic_sampling/filled"]) for r in rows] == [(1.0, 1.0), (1.0, 1.0)]
    ledger = read_ledger(str(out))
    assert Counter(r.get("dropped") for r in ledger) == {None: 8, "reward failed": 4, "over target": 4}
    assert ledger_checks(ledger) == {"twice": [], "lost_batches": [], "short_batches": []}
