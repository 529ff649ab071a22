"""The guess-number game written against every route of the gateway (chat completions streamed, OpenAI Responses and
Anthropic Messages, each streamed and not; examples/openai_agent/guess_number_agent.py) trains to the bits of the
same game written as an `Environment`: the same metrics, the same ledger tokens, the same final weights."""
import json
import os

import numpy as np
import pytest
from safetensors.numpy import load_file

from alignment.ppo import run_ppo
from tests.helpers import REPO, read_metrics, run_args
from tests.ppo.test_agents import NOT_COMPARED

AGENTS = {"chat-streamed": "play_streamed", "responses": "play_responses", "responses-streamed":
          "play_responses_streamed", "messages": "play_messages", "messages-streamed": "play_messages_streamed"}
STEPS = "2"


def game_args(out, model):
    return run_args(out, model, "grpo", "--save_steps", "0", "--max_steps", STEPS, "--max_trajectory_tokens", "120",
                    "--rollout_ledger", "true")


@pytest.fixture(scope="module")
def environment_run(tiny_model_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("environment")
    run_ppo.main(game_args(out, tiny_model_dir))
    return out


def ledger_tokens(out):
    rows = [json.loads(line) for path in sorted((out / "ledger").glob("steps-*.jsonl")) for line in open(path)]
    return [(row["response_ids"], row["policy_token"], row.get("behaviour_log_probs"), row["reward"]) for row in rows]


@pytest.mark.parametrize("route", sorted(AGENTS))
def test_an_agent_on_every_route_trains_to_the_bits_of_the_environment(route, environment_run, tiny_model_dir,
                                                                      tmp_path):
    args = game_args(tmp_path, tiny_model_dir)
    i = args.index("--environment")
    run_ppo.main(args[:i] + ["--environment", ""] + args[i + 2:] +
                 ["--agent", f"{os.path.join(REPO, 'examples', 'openai_agent', 'guess_number_agent.py')}:{AGENTS[route]}"])
    env_rows, agent_rows = read_metrics(environment_run), read_metrics(tmp_path)
    assert len(env_rows) == len(agent_rows) == int(STEPS)
    for env_row, agent_row in zip(env_rows, agent_rows):
        shared = {k: v for k, v in env_row.items() if not k.startswith(NOT_COMPARED)}
        assert shared == {k: agent_row[k] for k in shared}, (route, env_row, agent_row)
        assert agent_row["rollout/failed_episodes"] == 0 and agent_row["agent/prefix_breaks"] == 0
        assert agent_row["agent/calls"] == agent_row["env/turns"] > 1  # several calls made one trajectory
    assert any(r["actor_loss"] != 0 for r in env_rows)  # it trained on something
    tokens = ledger_tokens(tmp_path)
    assert tokens == ledger_tokens(environment_run) and len(tokens) == 4 * int(STEPS)
    env_weights, agent_weights = (load_file(os.path.join(out, "policy", "model.safetensors"))
                                  for out in (environment_run, tmp_path))
    for key in env_weights:
        np.testing.assert_array_equal(env_weights[key], agent_weights[key], err_msg=f"{route}: {key}")
