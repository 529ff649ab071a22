"""The `openenv` adapter with the real package: an environment found by id (a local environment directory, and the
same directory importable as a package), an MCPEnvironment's tools listed and called in-process and through its
server's `/ws` session with the same transcript, bad ids in one line, and a tiny GRPO step with MCP tools."""
import json
import os
import random
import sys

import numpy as np
import pytest

try:
    from openenv.core import MCPEnvironment  # noqa: F401  (imports fastmcp, whose client needs mcp < 2)
except ImportError as err:
    pytest.skip(f"the openenv package with a working fastmcp is not installed (requirements.txt installs "
                f"openenv 0.10): {err}", allow_module_level=True)

from alignment.envs import checked_reset, checked_step, environment_factory  # noqa: E402
from alignment.envs.adapters.common import row_seed  # noqa: E402
from alignment.ppo import run_ppo  # noqa: E402
from tests.helpers import REPO, read_metrics, served_in_thread  # noqa: E402

ENV_DIR = os.path.join(REPO, "examples", "openenv_guess_tools")
CALL = '<tool_call>{"name": "guess", "arguments": {"number": %s}}</tool_call>'


def play(env, row, turns):
    transcript = [checked_reset(env, row)]
    for text in turns:
        result = checked_step(env, text)
        transcript.append((result.observation, result.reward, result.done))
        if result.done:
            break
    return transcript


def secret_of(row):
    return random.Random(row_seed(row)).randint(1, 9)


def test_an_mcp_environment_found_by_its_directory_shows_and_runs_its_tools():
    env = environment_factory("openenv", {"id": ENV_DIR})()
    secret = secret_of({"input": "x"})
    transcript = play(env, {"input": "x"}, [CALL % (secret % 9 + 1), CALL % '"seven"', CALL % secret])
    system, user = transcript[0]
    assert user == {"role": "user", "content": "Find my number from 1 to 9 with the guess tool."}
    assert env.tool_schemas == [{"type": "function", "function": {
        "name": "guess", "description": "Guess the secret number.",
        "parameters": {"additionalProperties": False, "type": "object", "required": ["number"],
                       "properties": {"number": {"type": "integer", "description": "A whole number from 1 to 9."}}}}}]
    assert json.dumps(env.tool_schemas[0]) in system["content"]  # the server's schema, shown as it is
    first, bad, last = transcript[1:]
    assert first == ([{"role": "tool", "content": "Lower." if secret % 9 + 1 > secret else "Higher."}], -0.1, False)
    assert bad[0][0]["content"].startswith("Error: ") and "number" in bad[0][0]["content"] and not bad[2]
    assert last == ([{"role": "tool", "content": "Right."}], 1.0, True)
    assert play(env, {"input": "x"}, ["I give up."])[1] == ([], 0.0, True)  # a turn without a call ends it


def test_the_same_environment_as_an_installed_package_and_through_its_server_plays_the_same_episode():
    pytest.importorskip("uvicorn")
    sys.path.insert(0, os.path.dirname(ENV_DIR))  # the directory's package importable, as an installed one is
    try:
        packaged = environment_factory("openenv", {"id": "openenv-guess-tools"})()
    finally:
        sys.path.remove(os.path.dirname(ENV_DIR))
    row = {"input": "y", "seed": 4}
    turns = [CALL % (secret_of(row) % 9 + 1), CALL % secret_of(row)]
    local = play(environment_factory("openenv", {"id": ENV_DIR})(), row, turns)
    assert play(packaged, row, turns) == local
    from openenv_guess_tools.server.app import app
    with served_in_thread(app) as base_url:
        remote = environment_factory("openenv", {"base_url": base_url, "tools": True})()
        assert play(remote, row, turns) == local

def test_bad_ids_stop_in_one_line(tmp_path):
    (tmp_path / "empty_env").mkdir()
    cases = [({"id": "no-such-env"}, "neither a directory nor an installed environment package"),
             ({"id": str(tmp_path / "empty_env")}, "the directory has no openenv.yaml"),
             ({"id": ENV_DIR, "env": "x:y"}, "needs one of 'env'")]
    for args, message in cases:
        with pytest.raises(ValueError, match=message) as refused:
            environment_factory("openenv", args)
        assert "\n" not in str(refused.value)


def test_a_tiny_grpo_step_with_an_mcp_environment(tmp_path, tiny_model_dir):
    data = tmp_path / "rows.jsonl"
    data.write_text('{"prompt": "Guess.", "seed": 1}\n{"prompt": "Guess!", "seed": 2}\n')
    out = tmp_path / "out"
    run_ppo.main([os.path.join(REPO, "config", "tiny", "grpo_tools_argument.json"), "--actor_model_name_or_path",
                  tiny_model_dir, "--output_dir", str(out), "--disable_tqdm", "--environment", "openenv",
                  "--environment_args", json.dumps({"id": ENV_DIR, "format": "hermes-compact"}),
                  "--reward_funcs", "", "--gold_judge", "", "--max_turns", "3", "--max_new_tokens", "6",
                  "--max_length", "1024", "--max_trajectory_tokens", "48", "--num_return_sequences", "2",
                  "--per_device_prompt_batch_size", "2", "--per_device_train_batch_size", "4", "--max_steps", "1",
                  "--eval_datasets", "", "--logging_steps", "1", "--save_steps", "0",
                  "--train_datasets", f"prompt-only:1.0:{data}"])
    rows = [row for row in read_metrics(out) if "actor_loss" in row]
    assert len(rows) == 1 and np.isfinite(rows[0]["actor_loss"]) and 1 <= rows[0]["env/turns"] <= 3
    assert rows[0]["reward/environment"] == pytest.approx(rows[0]["env/reward"])
