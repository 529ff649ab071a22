"""Agent programs in the evaluation harness: an OpenAI-client program plays each row through the gateway over the
checkpoint (as key `agent` trains it), each session sampling from its sample's seed, so the same game written as an
Environment and as an agent program gives the same samples bit for bit; an episode whose agent fails scores 0 and
keeps its error; against an endpoint the agent's return value alone scores (reward functions are refused)."""
import os

import pytest

from alignment.commands import evaluate as cli
from alignment.data.user_modules import import_user_module
from alignment.evaluation.endpoint import EndpointPolicy
from alignment.evaluation.policies import LocalPolicy
from alignment.evaluation.runner import EvalSettings, evaluate
from alignment.evaluation.tasks import SpecTask
from alignment.inputs import InputError
from tests.helpers import GUESS, REPO

AGENT = os.path.join(REPO, "examples", "openai_agent", "guess_number_agent.py")
ROWS = f"prompt-only:1.0:{REPO}/data/reasoning/basic_arithmetic_train.jsonl"


def guess_task(**how):
    return SpecTask(ROWS, [], success_threshold=1.0, max_turns=3, max_new_tokens=6, max_episode_tokens=120, **how)


def test_an_agent_program_evaluates_to_the_bits_of_the_same_game_as_an_environment(tiny_model_dir):
    import_user_module(GUESS)  # registers the guess-number environment
    policy, settings = LocalPolicy(tiny_model_dir), EvalSettings(n=2, seed=5, batch_size=4, limit=3)
    as_environment = evaluate(policy, guess_task(environment="guess-number"), settings)["items"]
    as_agent = evaluate(policy, guess_task(agent=f"{AGENT}:play"), settings)["items"]
    for env_item, agent_item in zip(as_environment, as_agent):
        assert [s["completion"] for s in env_item["samples"]] == [s["completion"] for s in agent_item["samples"]]
        assert [s["reward"] for s in env_item["samples"]] == [s["reward"] for s in agent_item["samples"]]
        assert [s["tokens"] for s in env_item["samples"]] == [s["tokens"] for s in agent_item["samples"]]
    rewards = {s["reward"] for r in as_agent for s in r["samples"]}
    assert len(rewards) > 1 or rewards != {0.0}  # the games were played: wrong guesses cost 0.1 each


def test_a_failed_agent_episode_scores_0_and_keeps_its_error(tiny_model_dir, tmp_path, capsys):
    broken = tmp_path / "broken_agent.py"
    broken.write_text("def play(base_url, api_key, row):\n    return 'not a number'\n")
    items = evaluate(LocalPolicy(tiny_model_dir), guess_task(agent=f"{broken}:play"), EvalSettings(limit=2))["items"]
    assert [s["reward"] for r in items for s in r["samples"]] == [0.0, 0.0]
    assert all("returned 'not a number'" in s["agent_error"] for r in items for s in r["samples"])
    assert "broken_agent.py:play': 2 of 2 episodes of the batch failed" in capsys.readouterr().err


def test_an_agent_against_an_endpoint_refuses_reward_functions():
    task = SpecTask(ROWS, ["accuracy"], agent=f"{AGENT}:play")
    with pytest.raises(InputError, match="scored by its return value alone"):
        EndpointPolicy("http://127.0.0.1:9/v1").agent_episodes(task, [{"input": "x", "answer": "1"}], [[0, 0, 0]],
                                                               {}, 0)


def test_the_command_line_takes_an_agent(tiny_model_dir, tmp_path, capsys):
    cli.main(["--model", tiny_model_dir, "--dataset", ROWS, "--reward-funcs", "", "--agent", f"{AGENT}:play",
              "--max-new-tokens", "6", "--limit", "2", "--output-dir", str(tmp_path)])
    out = capsys.readouterr().out
    assert "| pass@1 |" in out
    written = [p for p in tmp_path.iterdir() if p.name.startswith("dataset_")]
    assert len(written) == 1 and (written[0] / "items.jsonl").read_text().count("agent_error") == 2
