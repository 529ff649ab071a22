"""Environments from real libraries (alignment/envs/adapters): each adapter plays its library's environments
through the Environment API (checked as a run checks them), replays an episode exactly under one seed, and
trains a tiny GRPO step. The libraries are the real packages of requirements.txt (extra 'envs'); TRL's classes
are tested against a class written to GRPOTrainer's documented interface (tests/envlibs/trl_calc.py) here, and
against TRL itself in tests/envs/test_env_adapters_trl.py (slow, in a virtualenv with TRL and torch)."""
import importlib.metadata
import json
import os
import random
import subprocess
import sys

import numpy as np
import pytest

from alignment.envs import EnvironmentFailure, checked_reset, checked_step, environment_factory
from alignment.envs.adapters.common import PrivateRandom, row_seed
from alignment.ppo import run_ppo
from tests.helpers import (REPO, environment_run_args, episodes_cancelled, read_metrics,
                           served_in_thread)



def _verifiers_version():
    try:
        return tuple(int(part) for part in importlib.metadata.version("verifiers").split(".")[:2])
    except importlib.metadata.PackageNotFoundError:
        return None


VERIFIERS = _verifiers_version()
needs_verifiers_03 = pytest.mark.skipif(VERIFIERS is None or VERIFIERS >= (0, 4),
                                        reason="these play the verifiers 0.3 route (requirements.txt pins 0.3.1; "
                                               f"0.4's: tests/envs/test_verifiers_v1.py); installed: {VERIFIERS}")
TRL_CLASS = os.path.join(REPO, "tests", "envlibs", "trl_calc.py") + ":AdditionEnv"


def play(env, row, turns):
    """The transcript of an episode whose turns are given."""
    transcript = [checked_reset(env, row)]
    for text in turns:
        result = checked_step(env, text)
        transcript.append((result.observation, result.reward, result.done, result.metrics))
        if result.done:
            break
    return transcript


def test_a_row_seed_is_its_seed_column_or_a_stable_hash_and_library_randomness_stays_private():
    assert row_seed({"seed": 5, "input": "a"}) == 5
    assert row_seed({"input": "a", "answer": "1"}) == row_seed({"answer": "1", "input": "a"}) != row_seed({"input": "b"})
    with pytest.raises(ValueError, match="row key 'seed'"):
        row_seed({"seed": -1})
    random.seed(3)
    np.random.seed(3)
    outside = (random.random(), np.random.rand())
    random.seed(3)
    np.random.seed(3)
    episode = PrivateRandom(11)
    with episode():
        random.seed(99)  # what GEM's reset(seed) does to the global generators
        first = random.random()
    with episode():
        second = random.random()
    assert (random.random(), np.random.rand()) == outside  # the trainer's global state is untouched
    reference = random.Random(99)
    assert (first, second) == (reference.random(), reference.random())  # the episode's stream goes on


def test_gem_plays_guess_the_number_with_its_own_rewards_and_replays_under_one_seed():
    gem_constants = pytest.importorskip("gem.utils.constants")
    build = environment_factory("gem", {"id": "game:GuessTheNumber-v0-easy"})
    env = build()
    first = play(env, {"seed": 3}, [r"\boxed{1}", r"\boxed{2}", r"\boxed{3}", r"\boxed{4}"])
    assert "Guess The Number" in first[0][0]["content"] and first[0][0]["role"] == "user"
    assert first[1][0][0]["content"].startswith("At turn 1, you guessed 1")
    assert play(build(), {"seed": 3}, [r"\boxed{1}", r"\boxed{2}", r"\boxed{3}", r"\boxed{4}"]) == first
    assert play(env, {"seed": 3}, ["no number"])[1][1:3] == (gem_constants.LanguageGameReward.format_error_reward,
                                                              True)
    with pytest.raises(ValueError, match="environment 'gem' refused its arguments .* not found in registry"):
        environment_factory("gem", {"id": "game:NoSuchGame-v0"})
    with pytest.raises(ValueError, match="observation wrappers"):
        environment_factory("gem", {"id": "game:GuessTheNumber-v0-easy", "wrappers": "concat"})


def test_a_gymnasium_style_class_from_a_file(tmp_path):
    (tmp_path / "counter.py").write_text(
        "class Counter:\n"
        "    def reset(self, seed=None):\n        self.n = seed % 5\n        return f'start at {self.n}', {}\n"
        "    def step(self, action):\n        self.n += 1\n"
        "        return f'now {self.n}', float(action == str(self.n)), self.n >= 6, False, {'n': self.n, 'x': 'y'}\n")
    env = environment_factory("gymnasium", {"env": f"{tmp_path}/counter.py:Counter"})()
    transcript = play(env, {"seed": 3}, ["4", "9", "x"])
    assert transcript[0] == [{"role": "user", "content": "start at 3"}]
    assert transcript[1:] == [([{"role": "user", "content": "now 4"}], 1.0, False, {"n": 4.0}),
                              ([{"role": "user", "content": "now 5"}], 0.0, False, {"n": 5.0}),
                              ([{"role": "user", "content": "now 6"}], 0.0, True, {"n": 6.0})]


def test_skyrl_gym_multi_turn_gsm8k_scores_each_turn_and_ends_by_its_own_limit():
    env = environment_factory("skyrl-gym", {"id": "gsm8k_multi_turn", "max_turns": 2})()
    transcript = play(env, {"input": "What is 2 + 3?", "answer": "5"}, ["#### 4", "#### 5", "#### 5"])
    assert transcript[0] == [{"role": "user", "content": "What is 2 + 3?"}]
    (hint, wrong, more, _), (last, right, done, metrics) = transcript[1], transcript[2]
    assert wrong == pytest.approx(0.2 / 2) and not more and "#### ANSWER" in hint[0]["content"]
    assert (last, right, done, metrics) == ([], 1.0, True, {"steps": 2.0})
    with pytest.raises(ValueError, match="no environment 'nope' is registered"):
        environment_factory("skyrl-gym", {"id": "nope"})


def test_textarena_tic_tac_toe_against_the_seeded_random_opponent():
    build = environment_factory("textarena", {"id": "TicTacToe-v0"})
    moves = [f"[{cell}]" for cell in (4, 0, 8, 2, 6, 1, 3, 5, 7)]
    first = play(build(), {"seed": 1}, moves)
    assert "Available Moves: '[0]'" in first[0][0]["content"] and first[0][0]["content"].startswith("[GAME]")
    assert "[Player 1]" in first[1][0][0]["content"]  # the opponent moved between the policy's turns
    final = first[-1]
    assert final[2] and final[1] in (1.0, 0.0, -1.0) and "turn_count" in final[3]
    assert play(build(), {"seed": 1}, moves) == first
    assert play(build(), {"seed": 2}, moves) != first
    invalid = play(build(), {"seed": 1}, ["I do not know"] * 3)
    assert invalid[-1][1] == -1.0 and invalid[-1][3]["invalid_move"] == 1.0


def test_textarena_takes_an_opponent_function_and_names_a_bad_one(tmp_path):
    (tmp_path / "corner.py").write_text("def first_listed(observation):\n"
                                        "    return observation.rsplit('Available Moves: ', 1)[1].split(',')[0]"
                                        ".strip(\"'\")\n")
    env = environment_factory("textarena", {"id": "TicTacToe-v0", "opponent": f"{tmp_path}/corner.py:first_listed"})()
    transcript = play(env, {"seed": 0}, ["[4]"])
    assert "Player 1 placed their symbol (X) in cell 0" in transcript[1][0][0]["content"]
    with pytest.raises(ValueError, match="neither 'random-move' nor"):
        environment_factory("textarena", {"id": "TicTacToe-v0", "opponent": "best"})


@needs_verifiers_03
def test_verifiers_guessing_game_is_scored_by_its_rubric():
    build = environment_factory("verifiers", {"id": "tests.envlibs.vf_guess"})
    transcript = play(build(), {"input": "Guess.", "answer": "7"}, ["5", "7"])
    assert transcript[0] == [{"role": "system", "content": "Guess the number."}, {"role": "user", "content": "Guess."}]
    assert transcript[1] == ([{"role": "user", "content": "Higher."}], 0.0, False, {})
    observation, reward, done, metrics = transcript[2]
    assert done and reward == pytest.approx(1.0 + 0.5 * (1 / 2))  # guessed + 0.5 * short (two turns)
    assert metrics == {"guessed": 1.0, "short": 0.5, "num_turns": 2.0, "errors": 0.0}
    lost = play(build(), {"input": "Guess.", "answer": "7"}, ["a", "b", "c", "d"])
    assert len(lost) == 4 and lost[-1][1] == pytest.approx(0.5 / 3)  # the environment's max_turns (3) ended it
    own_row = play(build(), {"example_id": 1, "input": "ignored"}, ["7"])  # the environment's dataset row 1
    assert own_row[0][-1]["content"] == "Guess my number (1-9)." and own_row[1][1] == pytest.approx(1.5)


@needs_verifiers_03
def test_verifiers_group_level_reward_functions_are_refused_at_load_even_inside_a_rubric_group():
    with pytest.raises(ValueError) as refused:
        environment_factory("verifiers", {"id": "tests.envlibs.vf_guess", "args": {"kind": "grouped"}})
    assert "\n" not in str(refused.value) and str(refused.value).startswith("key 'environment': ")
    assert str(refused.value).endswith("environment 'verifiers' 'tests.envlibs.vf_guess': reward function "
                                       "'shorter_than_the_group' of its rubric is group-level (it scores a whole "
                                       "group at once); only per-rollout reward functions are supported")


@needs_verifiers_03
def test_verifiers_tools_are_shown_in_the_format_and_called_from_the_policy_text():
    env = environment_factory("verifiers", {"id": "tests.envlibs.vf_guess", "args": {"kind": "tools"}})()
    prompt = checked_reset(env, {"input": "What is 2 + 3?", "answer": "5"})
    assert prompt[0]["content"].startswith("Use the tools.") and '"name": "add"' in prompt[0]["content"]
    assert env.stop_strings == ("</tool_call>",)
    result = checked_step(env, '<tool_call>{"name": "add", "arguments": {"a": 2, "b": 3}}</tool_call>')
    assert result.observation == [{"role": "tool", "content": "5"}] and not result.done
    final = checked_step(env, "It is 5.")
    assert final.done and final.reward == 1.0 and final.metrics["add_calls"] == 1.0


def test_openenv_in_process_and_through_its_server_play_the_same_episode():
    pytest.importorskip("uvicorn")
    from openenv.core import create_app
    from tests.envlibs.openenv_guess import GuessAction, GuessEnvironment, GuessObservation

    local = environment_factory("openenv", {"env": "tests.envlibs.openenv_guess:GuessEnvironment"})()
    secret = random.Random(row_seed({"input": "x"})).randint(1, 9)
    turns = [str(secret % 9 + 1), "no idea", str(secret)]
    transcript = play(local, {"input": "x"}, turns)
    assert transcript[0] == [{"role": "user", "content": "Guess my number from 1 to 9."}]
    assert [step[1:3] for step in transcript[1:]] == [(-0.1, False), (-0.1, False), (1.0, True)]
    assert transcript[2][0] == [{"role": "user", "content": "A number, please."}]
    app = create_app(GuessEnvironment, GuessAction, GuessObservation, max_concurrent_envs=4)
    with served_in_thread(app) as base_url:
        remote = environment_factory("openenv", {"base_url": base_url, "action_field": "guess"})()
        assert play(remote, {"input": "x"}, turns) == transcript
    with pytest.raises(ValueError, match="one of 'env'"):
        environment_factory("openenv", {})


def test_trl_environment_class_methods_are_tools_and_get_reward_is_the_reward():
    env = environment_factory("trl", {"cls": TRL_CLASS})()
    assert sorted(env.tools) == ["add", "submit"]  # not reset, get_reward or _private
    prompt = checked_reset(env, {"input": "What is 2 + 3?", "answer": "5"})
    assert prompt[-1] == {"role": "user", "content": "What is 2 + 3? (use the tools)"}  # reset's text appended
    assert env.tools["add"].schema["function"]["parameters"]["required"] == ["a", "b"]
    call = '<tool_call>{"name": "%s", "arguments": %s}</tool_call>'
    assert checked_step(env, call % ("add", '{"a": 2, "b": 3}')).observation == [{"role": "tool", "content": "5"}]
    assert checked_step(env, call % ("submit", '{"value": 5}')).observation[0]["content"] == "submitted"  # async
    assert checked_step(env, "Done.")[1:3] == (1.0, True)
    again = environment_factory("trl", {"cls": TRL_CLASS})()
    checked_reset(again, {"input": "?", "answer": "5"})
    assert checked_step(again, "5")[1:3] == (0.0, True)  # never submitted
    with pytest.raises(EnvironmentFailure, match=r"environment 'trl\[AdditionEnv\]': reset raised KeyError"):
        checked_reset(again, {"input": "no answer column"})


def test_routed_plays_each_row_with_the_environment_its_column_names():
    build = environment_factory("routed", {"environments": {
        "math": {"environment": "skyrl-gym", "environment_args": {"id": "gsm8k"}},
        "guess": os.path.join(REPO, "examples", "guess_number_env.py") + ":GuessNumber"}})
    env = build()
    assert play(env, {"environment": "math", "input": "2 + 3?", "answer": "5"}, ["#### 5"])[1][1:3] == (1.0, True)
    assert env.env_name == "skyrl-gym[gsm8k]"
    assert play(env, {"environment": "guess", "input": "?", "answer": "7"}, ["3"])[1][0] == \
        [{"role": "user", "content": "Higher."}]
    with pytest.raises(EnvironmentFailure, match="row key 'environment' is 'chess'"):
        checked_reset(env, {"environment": "chess", "input": "?"})
    with pytest.raises(ValueError, match="entry 'x': 'nope' is not a registered environment"):
        environment_factory("routed", {"environments": {"x": "nope"}})


ROWS = [{"prompt": "What is 2 + 3?", "answer": "5", "seed": 1, "environment": "math"},
        {"prompt": "What is 40 + 2?", "answer": "42", "seed": 2, "environment": "game"}]
GRPO_CASES = {
    "gem": ("gem", {"id": "game:GuessTheNumber-v0-easy"}),
    "skyrl-gym": ("skyrl-gym", {"id": "gsm8k_multi_turn", "max_turns": 2}),
    "textarena": ("textarena", {"id": "TicTacToe-v0"}),
    "verifiers": ("verifiers", {"id": "tests.envlibs.vf_guess"}),
    "openenv": ("openenv", {"env": "tests.envlibs.openenv_guess:GuessEnvironment"}),
    "trl": ("trl", {"cls": TRL_CLASS, "format": "hermes-compact"}),
    "routed": ("routed", {"environments": {"math": {"environment": "skyrl-gym", "environment_args": {"id": "gsm8k"}},
                                           "game": {"environment": "gem",
                                                    "environment_args": {"id": "game:GuessTheNumber-v0-easy"}}}}),
}


@pytest.mark.parametrize("case", [pytest.param(case, marks=needs_verifiers_03) if case == "verifiers" else case
                                  for case in GRPO_CASES])
def test_each_library_trains_a_tiny_grpo_step(tmp_path, tiny_model_dir, case):
    environment, environment_args = GRPO_CASES[case]
    data = tmp_path / "rows.jsonl"
    data.write_text("".join(json.dumps(row) + "\n" for row in ROWS))
    out = tmp_path / "out"
    run_ppo.main(environment_run_args(out, tiny_model_dir, environment, environment_args, data))
    rows = [row for row in read_metrics(out) if "actor_loss" in row]
    assert len(rows) == 1 and np.isfinite(rows[0]["actor_loss"])
    assert 1 <= rows[0]["env/turns"] <= 3 and np.isfinite(rows[0]["env/reward"])
    assert rows[0]["reward/environment"] == pytest.approx(rows[0]["env/reward"])  # the library's reward, trained on
    assert os.path.isfile(out / "policy" / "model.safetensors")


@needs_verifiers_03
def test_a_verifiers_episode_left_waiting_is_cancelled_when_the_rollout_drops_it():
    build = environment_factory("verifiers", {"id": "tests.envlibs.vf_guess"})
    envs = [build() for _ in range(3)]
    for env in envs:
        checked_reset(env, {"input": "Guess.", "answer": "7"})
        assert not checked_step(env, "5").done  # cut here, as by max_turns 1: its rollout waits for a turn
    episodes = [env.episode for env in envs]
    del env, envs
    assert episodes_cancelled(episodes)  # and no longer held by the event loop


@needs_verifiers_03
# ("tools", ...): a verifiers ToolEnv (it imports openai-agents' `agents`) trained through the stage's script
@pytest.mark.parametrize("kind, max_turns, exit_code", [("game", 1, 0), ("breaks", 3, 2), ("tools", 2, 0)])
def test_verifiers_episodes_cut_by_max_turns_or_left_by_a_raising_step_end_cleanly(tmp_path, tiny_model_dir, kind,
                                                                                    max_turns, exit_code):
    """A verifiers rollout waits for a turn that never comes when max_turns cuts its episode or another episode's
    step raises; the run cancels and awaits it, so asyncio reports no task destroyed while pending at exit."""
    data = tmp_path / "rows.jsonl"
    data.write_text('{"prompt": "Guess.", "answer": "7", "seed": 1}\n{"prompt": "Guess!", "answer": "3", "seed": 2}\n')
    run = subprocess.run(
        [sys.executable, os.path.join(REPO, "alignment", "ppo", "run_ppo.py"),
         *environment_run_args(tmp_path / "out", tiny_model_dir, "verifiers",
                               {"id": "tests.envlibs.vf_guess", "args": {"kind": kind}}, data, max_turns, max_steps=2),
         "--max_failed_group_fraction", "0"],  # "breaks": its group, retried and dropped, stops the run
        cwd=REPO, capture_output=True, text=True, timeout=600, env={**os.environ, "PYTHONPATH": REPO})
    assert run.returncode == exit_code, run.stderr[-2000:]
    assert "Task was destroyed" not in run.stderr and "never retrieved" not in run.stderr, run.stderr[-3000:]
    if kind == "breaks":
        errors = [line for line in run.stderr.splitlines() if line.startswith("error:")]
        assert len(errors) == 1 and "RuntimeError: the game broke" in errors[0] and "Traceback" not in run.stderr
