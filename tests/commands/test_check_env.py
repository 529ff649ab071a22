"""alignment-check-env: random-policy episodes of any environment, reporting what a run would stop on with the run's
own one-line errors (exit 2), nondeterminism and slow steps as warnings, and latencies."""
import json
import os
import subprocess
import sys

import pytest

from alignment.commands import check_env
from tests.helpers import REPO

GUESS = os.path.join(REPO, "examples", "guess_number_env.py")


@pytest.fixture
def rows(tmp_path):
    path = tmp_path / "rows.jsonl"
    path.write_text("".join(json.dumps({"prompt": f"Question {i}", "answer": str(10 + i), "seed": i}) + "\n"
                            for i in range(3)))
    return str(path)


def run(*args):
    return subprocess.run([sys.executable, os.path.join(REPO, "tools", "check_env.py"), *args], cwd=REPO,
                          capture_output=True, text=True, timeout=300)


def test_a_registered_environment_plays_and_reports_latency(rows, capsys):
    report = check_env.main(["guess-number", "--env-modules", GUESS, "--rows", rows, "--episodes", "2",
                             "--max-turns", "3"])
    assert [e["row"] for e in report["episodes"]] == [0, 1] and report["warnings"] == []
    first = report["episodes"][0]
    assert first["name"] == "guess-number" and len(first["step_seconds"]) == len(first["rewards"]) <= 3
    assert first["transcript"][0][0]["content"].startswith("I am thinking of a number")
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("row 0: guess-number, ") and out[-1].startswith("ok: 2 episodes, reset mean")


def test_tools_get_well_formed_random_calls(rows):
    report = check_env.main(["tools", "--env-args", '{"tools": ["calculator"]}', "--rows", rows, "--episodes", "3",
                             "--max-turns", "4", "--seed", "1"])
    calls = [turn for e in report["episodes"] for turn in e["transcript"][1:] if "<tool_call>" in turn[0]]
    assert calls and all(turn[4]["tool_calls"] == 1.0 for turn in calls)  # parsed and run as calls
    assert all(json.loads(turn[0].split("\n")[1])["name"] == "calculator" for turn in calls)


def test_timing_metrics_are_not_compared_between_the_two_plays(rows):
    """The tools environment reports tool_time (wall-clock seconds, different on each play): the check compares
    everything else, so it finds the same episode twice, and still reports a real difference."""
    from alignment.envs import TIMING_METRICS

    assert "tool_time" in TIMING_METRICS
    report = check_env.main(["tools", "--env-args", '{"tools": ["calculator"]}', "--rows", rows, "--episodes", "3",
                             "--max-turns", "4", "--seed", "1"])
    timed = [turn[4]["tool_time"] for e in report["episodes"] for turn in e["transcript"][1:]
             if turn[4].get("tool_calls")]
    assert timed and all(t > 0 for t in timed)  # measured, so it differs between the plays
    assert report["warnings"] == []
    first = [[{"role": "user", "content": "q"}], ["a", [], 0.0, True, {"tool_time": 0.1, "tool_calls": 1.0}]]
    same = [[{"role": "user", "content": "q"}], ["a", [], 0.0, True, {"tool_time": 0.2, "tool_calls": 1.0}]]
    other = [[{"role": "user", "content": "q"}], ["a", [], 0.0, True, {"tool_time": 0.1, "tool_calls": 2.0}]]
    assert check_env.without_timing(first) == check_env.without_timing(same)
    assert check_env.without_timing(first) != check_env.without_timing(other)


def test_an_argument_file_names_the_environment_and_a_file_class_works(tmp_path, rows):
    config = tmp_path / "run.json"
    config.write_text(json.dumps({"environment": "trl", "environment_args": {
        "cls": os.path.join(REPO, "tests", "envlibs", "trl_calc.py") + ":AdditionEnv"}, "max_turns": 2}))
    report = check_env.main([str(config), "--rows", rows, "--episodes", "1"])
    assert report["episodes"][0]["name"] == "trl[AdditionEnv]" and len(report["episodes"][0]["rewards"]) <= 2
    spec = f"{GUESS}:GuessNumber"
    assert check_env.main([spec, "--rows", rows, "--episodes", "1"])["episodes"][0]["name"] == "guess-number"


BROKEN = """import random
from alignment.envs import Environment, StepResult

class Flaky(Environment):
    NAME = "test-check-env-flaky"
    def reset(self, row):
        return [{"role": "user", "content": str(random.random())}]
    def step(self, text):
        return StepResult([], 1.0, True)

class WrongType(Environment):
    NAME = "test-check-env-wrong-type"
    def reset(self, row):
        return [{"role": "user", "content": "hi"}]
    def step(self, text):
        return StepResult([{"role": "user", "content": "again"}], "0.5", False)
"""


def test_what_a_run_would_stop_on_exits_2_in_one_line_and_nondeterminism_warns(tmp_path, rows):
    (tmp_path / "broken.py").write_text(BROKEN)
    done = run("test-check-env-wrong-type", "--env-modules", str(tmp_path / "broken.py"), "--rows", rows)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert done.stderr.strip() == ("error: environment 'test-check-env-wrong-type': step returned reward '0.5'; it "
                                   "must be a finite number")
    flaky = run("test-check-env-flaky", "--env-modules", str(tmp_path / "broken.py"), "--rows", rows,
                "--episodes", "1")
    assert flaky.returncode == 0
    assert "warning: row 0: not deterministic under one seed: a second play had different first messages" in \
        flaky.stdout
    missing = run("trl", "--env-args", json.dumps({"cls": os.path.join(REPO, "tests", "envlibs", "trl_calc.py") +
                                                   ":AdditionEnv"}), "--rows", str(tmp_path / "none.jsonl"))
    assert missing.returncode == 2 and missing.stderr.count("\n") == 1 and "none.jsonl" in missing.stderr
    unknown = run("no-such-env", "--rows", rows)
    assert unknown.returncode == 2 and "'no-such-env' is not a registered environment" in unknown.stderr
