"""verifiers 0.4 (its v1 API: Taskset / Task / Toolset, `@vf.reward`) through the "verifiers" adapter
(alignment/envs/adapters/verifiers_v1.py), with the real package. verifiers 0.4 pins mcp 2, which requirements.txt's
openenv 0.10 rules out, so these tests run in the overlay environment of `.ci/verifiers-overlay.sh` (CI does) and
skip elsewhere. The tasksets are tests/envlibs/vf1: top-level modules, as verifiers loads tasksets."""
import importlib.metadata
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from alignment.envs import EnvironmentFailure, checked_reset, checked_step, environment_factory
from alignment.ppo import run_ppo
from tests.helpers import REPO, environment_run_args, episodes_cancelled, read_metrics

pytest.importorskip("verifiers", reason="needs verifiers >= 0.4 (pip install -r requirements-verifiers.txt)")
VERSION = importlib.metadata.version("verifiers")
if tuple(int(part) for part in VERSION.split(".")[:2]) < (0, 4):
    pytest.skip(f"needs verifiers >= 0.4 (installed: {VERSION}; requirements.txt pins 0.3.1): run in the overlay "
                f"environment of .ci/verifiers-overlay.sh (pip install -r requirements-verifiers.txt)",
                allow_module_level=True)

TASKSETS = os.path.join(REPO, "tests", "envlibs", "vf1")
CALL = '<tool_call>{"name": "calc_add", "arguments": {"a": 2, "b": 3}}</tool_call>'


@pytest.fixture(autouse=True)
def tasksets_importable(monkeypatch):
    """The test tasksets on sys.path, and on PYTHONPATH for their tool servers (`python -m vf1_addition`)."""
    monkeypatch.syspath_prepend(TASKSETS)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([TASKSETS, REPO, os.environ.get("PYTHONPATH", "")]))


def play(env, row, turns):
    transcript = [checked_reset(env, row)]
    for text in turns:
        result = checked_step(env, text)
        transcript.append(tuple(result))
        if result.done:
            break
    return transcript


def test_a_single_turn_task_is_scored_by_its_weighted_rewards_and_metrics():
    build = environment_factory("verifiers", {"id": "vf1_addition"})
    assert build().env_name == "verifiers[vf1_addition]" and build().stop_strings == ()
    right = play(build(), {"input": "What is 2 + 3?", "answer": "5"}, ["5"])
    assert right[0] == [{"role": "user", "content": "What is 2 + 3?"}]
    # exact 1 + 0.5 * brief (1 / one assistant turn); the metric reply_chars is len("5")
    assert right[1] == ([], 1.5, True, {"exact": 1.0, "brief": 1.0, "reply_chars": 1.0, "num_turns": 1.0})
    wrong = play(build(), {"input": "What is 2 + 3?", "answer": "5"}, ["six"])
    assert wrong[1][1:3] == (0.5, True) and wrong[1][3]["exact"] == 0.0 and wrong[1][3]["reply_chars"] == 3.0
    own = play(build(), {"example_id": 1, "input": "ignored"}, ["42"])  # the taskset's task 1, its system prompt
    assert own[0] == [{"role": "system", "content": "Answer with the number."},
                      {"role": "user", "content": "What is 40 + 2?"}]
    assert own[1][1] == 1.5


def test_tools_are_served_over_mcp_shown_in_the_format_called_from_the_policy_text_and_stops_apply():
    env = environment_factory("verifiers", {"id": "vf1_addition", "args": {"use_tools": True}})()
    prompt = checked_reset(env, {"input": "What is 2 + 3?", "answer": "5"})
    assert prompt[0]["role"] == "system" and '"name": "calc_add"' in prompt[0]["content"]
    assert [tool["function"]["name"] for tool in env.tool_schemas] == ["calc_add"]
    assert env.stop_strings == ("</tool_call>",)
    result = checked_step(env, CALL)
    assert tuple(result) == ([{"role": "tool", "content": "5"}], 0.0, False, {})  # the MCP server's answer
    final = checked_step(env, "5")
    assert final.done and final.reward == 1.25  # exact 1 + 0.5 * brief (two assistant turns)
    assert final.metrics == {"exact": 1.0, "brief": 0.5, "reply_chars": 1.0, "num_turns": 2.0}
    stopped = environment_factory("verifiers", {"id": "vf1_addition", "args": {"use_tools": True}})()
    checked_reset(stopped, {"input": "What is 2 + 3?", "answer": "5"})
    result = checked_step(stopped, "I give up. " + CALL)  # the task's @vf.stop ends it before the next model call
    assert tuple(result) == ([], 0.5, True, {"exact": 0.0, "brief": 1.0, "reply_chars": 85.0, "num_turns": 1.0})


def test_a_group_level_reward_is_refused_at_load_in_one_line():
    with pytest.raises(ValueError) as refused:
        environment_factory("verifiers", {"id": "vf1_ranked"})
    assert "\n" not in str(refused.value) and str(refused.value).startswith("key 'environment': ")
    assert str(refused.value).endswith("environment 'verifiers' 'vf1_ranked': its environment RankedEnv judges an "
                                       "episode's traces together (finalize(), a group-level reward); only "
                                       "per-trace rewards are supported")


def test_bad_arguments_and_rows_stop_in_one_line_naming_the_key():
    with pytest.raises(ValueError) as refused:
        environment_factory("verifiers", {"id": "vf1_addition", "args": {"use_tools": "sometimes"}})
    assert "\n" not in str(refused.value) and "loading the taskset failed: ValidationError: use_tools:" in \
        str(refused.value)
    with pytest.raises(ValueError, match="loading the taskset failed: ModuleNotFoundError: taskset 'no_such_set'"):
        environment_factory("verifiers", {"id": "no_such_set"})
    env = environment_factory("verifiers", {"id": "vf1_addition"})()
    with pytest.raises(EnvironmentFailure) as failed:
        checked_reset(env, {"input": "What is 2 + 3?", "answer": "five"})
    assert "\n" not in str(failed.value) and "the row does not make a AdditionData: answer: Input should be a valid " \
        "integer" in str(failed.value)
    with pytest.raises(EnvironmentFailure, match="row key 'example_id' is 2; the taskset has 2 tasks$"):
        checked_reset(env, {"example_id": 2, "input": "?"})


def test_an_episode_left_waiting_is_cancelled_and_its_rollout_closed():
    from alignment.envs.adapters.verifiers_v1 import _loaded

    build = environment_factory("verifiers", {"id": "vf1_addition", "args": {"use_tools": True}})
    envs = [build() for _ in range(2)]
    for env in envs:
        checked_reset(env, {"input": "What is 2 + 3?", "answer": "5"})
        assert not checked_step(env, CALL).done  # cut here, as by max_turns 1: its rollout waits for a turn
    episodes = [env.episode for env in envs]
    del env, envs
    assert episodes_cancelled(episodes)  # and no longer held by the event loop
    endpoint = _loaded("vf1_addition", json.dumps({"use_tools": True})).endpoint
    assert endpoint.episodes == {}  # no model call of theirs is left waiting


def test_the_adapters_page_plays_a_verifiers_04_taskset_with_check_env():
    from docsgen.runnable import block_on

    block = block_on('agentic/adapters.md', "tests/envs/test_verifiers_v1.py")
    path = os.pathsep.join([os.path.dirname(sys.executable), os.environ["PATH"]])  # `python`: this environment's
    done = subprocess.run(["bash", "-euo", "pipefail", "-c", block.script], cwd=REPO, capture_output=True, text=True,
                          timeout=600, env={**os.environ, "PATH": path, "PYTHONPATH": REPO})
    assert done.returncode == 0, done.stderr[-3000:]
    assert "ok: 2 episodes" in done.stdout and "verifiers[vf1_addition]" in done.stdout, done.stdout


ROWS = [{"prompt": "What is 2 + 3?", "answer": "5", "seed": 1},
        {"prompt": "What is 40 + 2?", "answer": "42", "seed": 2}]


@pytest.mark.parametrize("args", [{}, {"use_tools": True}], ids=["single-turn", "tools"])
def test_a_tiny_grpo_step_trains_on_the_tasksets_reward(tmp_path, tiny_model_dir, args):
    data = tmp_path / "rows.jsonl"
    data.write_text("".join(json.dumps(row) + "\n" for row in ROWS))
    out = tmp_path / "out"
    run_ppo.main(environment_run_args(out, tiny_model_dir, "verifiers", {"id": "vf1_addition", "args": args}, data,
                                      max_turns=2))
    rows = [row for row in read_metrics(out) if "actor_loss" in row]
    assert len(rows) == 1 and np.isfinite(rows[0]["actor_loss"])
    # a random tiny policy answers wrong: every reward is 0.5 * brief, brief = 1 / its assistant turns (1 or 2)
    assert 0.25 <= rows[0]["env/reward"] <= 0.5
    assert rows[0]["reward/environment"] == pytest.approx(rows[0]["env/reward"])
    assert os.path.isfile(out / "policy" / "model.safetensors")


# every turn read as a call of the add tool: a rollout always asks for a second turn, which max_turns 1 cuts
ALWAYS_ADD = """from alignment.envs.formats import HermesFormat
from alignment.envs.tools import ToolCall


class AlwaysAdd(HermesFormat):
    NAME = "always-add"

    def parse(self, text):
        return [ToolCall("calc_add", {"a": 2, "b": 3})]
"""


@pytest.mark.parametrize("environment_args, max_turns, exit_code", [
    ({"id": "vf1_addition", "args": {"use_tools": True}, "format": "always-add"}, 1, 0),
    ({"id": "vf1_addition", "args": {"task": {"breaks_on": 5}}}, 2, 2)], ids=["cut", "breaks"])
def test_episodes_cut_by_max_turns_or_failing_end_cleanly(tmp_path, tiny_model_dir, environment_args, max_turns,
                                                          exit_code):
    """Every rollout cut by max_turns waits for a turn that never comes; one whose scoring raises stops the run.
    Either way the run cancels and awaits its rollouts: no task destroyed while pending, one error line, no
    traceback."""
    data = tmp_path / "rows.jsonl"
    data.write_text("".join(json.dumps(row) + "\n" for row in ROWS))
    (tmp_path / "always_add.py").write_text(ALWAYS_ADD)
    run = subprocess.run(
        [sys.executable, os.path.join(REPO, "alignment", "ppo", "run_ppo.py"),
         *environment_run_args(tmp_path / "out", tiny_model_dir, "verifiers", environment_args, data, max_turns),
         "--user_env_modules", str(tmp_path / "always_add.py"), "--max_failed_group_fraction", "0"],
        cwd=REPO, capture_output=True, text=True, timeout=900)
    assert run.returncode == exit_code, run.stderr[-3000:]
    assert "Task was destroyed" not in run.stderr and "never retrieved" not in run.stderr, run.stderr[-3000:]
    assert "HTTP Request:" not in run.stderr and "interception down" not in run.stderr  # no line per model call
    if exit_code:
        errors = [line for line in run.stderr.splitlines() if line.startswith("error:")]
        assert len(errors) == 1 and "RuntimeError: the scoring broke" in errors[0], run.stderr[-3000:]
        assert "Traceback" not in run.stderr, run.stderr[-3000:]
    else:  # every episode was cut after its one turn (a call of the tool), unscored
        rows = [row for row in read_metrics(tmp_path / "out") if "actor_loss" in row]
        assert rows[0]["env/turns"] == 1 and rows[0]["env/reward"] == 0.0, rows
