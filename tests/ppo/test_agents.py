"""Agent programs trained through the gateway (key `agent`, alignment/ppo/rollout/agent_programs.py), with the real
`openai` package: the same episodes written as an Environment and as an OpenAI-client agent train to the same bits;
agents that raise (retried, then their group dropped), time out or edit their history; the one-line stop when too
many episodes fail."""
import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from safetensors.numpy import load_file

from alignment.ppo import run_ppo
from tests.helpers import REPO, read_metrics, run_args

AGENT = os.path.join(REPO, "examples", "openai_agent", "guess_number_agent.py")
# logged only by one of the two ways (agent/*), or by the wall clock; truncated and env/truncated: an
# environment's episode cut by max_turns is truncated, an agent's ends when its program returns (the gateway cannot
# tell why), and is truncated only when the token budget cuts a turn
NOT_COMPARED = ("time/", "agent/", "env/truncated", "truncated")


def agent_args(out, model, *extra):
    """run_args' guess-number GRPO run with the agent program instead of the environment."""
    args = run_args(out, model, "grpo", "--save_steps", "0", "--max_steps", "3", "--max_trajectory_tokens", "120",
                    *extra)
    i = args.index("--environment")
    return args[:i] + ["--environment", ""] + args[i + 2:] + ["--agent", f"{AGENT}:play"]  # "" unsets it


def test_an_agent_program_trains_to_the_bits_of_the_same_episodes_as_an_environment(tmp_path, tiny_model_dir):
    env_out, agent_out = tmp_path / "environment", tmp_path / "agent"
    run_ppo.main(run_args(env_out, tiny_model_dir, "grpo", "--save_steps", "0", "--max_steps", "3",
                          "--max_trajectory_tokens", "120"))
    run_ppo.main(agent_args(agent_out, tiny_model_dir, "--rollout_ledger", "true"))
    env_rows, agent_rows = read_metrics(env_out), read_metrics(agent_out)
    assert len(env_rows) == len(agent_rows) == 3
    for env_row, agent_row in zip(env_rows, agent_rows):
        shared = {k: v for k, v in env_row.items() if not k.startswith(NOT_COMPARED)}
        assert shared == {k: agent_row[k] for k in shared}, (env_row, agent_row)
        assert agent_row["rollout/failed_episodes"] == 0 and agent_row["agent/prefix_breaks"] == 0
        assert agent_row["agent/calls"] == agent_row["env/turns"] > 1  # several calls made one trajectory
    assert any(r["actor_loss"] != 0 for r in env_rows)  # it trained on something
    env_weights, agent_weights = (load_file(os.path.join(out, "policy", "model.safetensors"))
                                  for out in (env_out, agent_out))
    for key in env_weights:
        np.testing.assert_array_equal(env_weights[key], agent_weights[key], err_msg=key)
    first = json.loads(next(open(next((agent_out / "ledger").glob("steps-*.jsonl")), encoding="utf-8")))
    assert len(first["calls"]) >= 1 and first["prefix_breaks"] == 0 and first["agent_error"] is None
    assert sum(len(c["sampled"]) for c in first["calls"]) == sum(first["policy_token"])


AGENTS = textwrap.dedent('''
    import time
    import openai

    ASK = "I am thinking of a number from 1 to 100. Guess it."

    def flaky(base_url, api_key, row):
        client = openai.OpenAI(base_url=base_url, api_key=api_key)
        client.chat.completions.create(model="policy", messages=[{"role": "user", "content": ASK}])
        if int(row["answer"]) % 2:
            raise RuntimeError("the game server is down")
        return 0.5

    def always_raises(base_url, api_key, row):
        raise RuntimeError("cannot reach the game")

    def sleeps(base_url, api_key, row):
        time.sleep(30)

    def edits_its_history(base_url, api_key, row):
        client = openai.OpenAI(base_url=base_url, api_key=api_key)
        first = client.chat.completions.create(model="policy", messages=[{"role": "user", "content": ASK}])
        text = first.choices[0].message.content
        client.chat.completions.create(model="policy", messages=[{"role": "user", "content": ASK},
                                       {"role": "assistant", "content": text}, {"role": "user", "content": "No."}])
        client.chat.completions.create(model="policy", messages=[{"role": "user", "content": "Again: " + ASK}])
        return 1.0
''')


@pytest.fixture(scope="module")
def agents_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("agents") / "agents.py"
    path.write_text(AGENTS)
    return str(path)


def with_agent(args, spec):
    i = args.index("--agent")
    return args[:i] + ["--agent", spec] + args[i + 2:]


def test_failed_episodes_count_and_an_edited_history_starts_a_new_sample(tmp_path, tiny_model_dir, agents_file,
                                                                        capsys):
    run_ppo.main(with_agent(agent_args(tmp_path / "flaky", tiny_model_dir, "--max_steps", "1"),
                            f"{agents_file}:flaky"))
    row = read_metrics(tmp_path / "flaky")[0]
    # the odd answer's group fails in every try: dropped whole; the even one's trains (one call per episode)
    assert row["rollout/failed_episodes"] == 0.5 and row["rollout/failed_groups"] == 1 and row["agent/calls"] == 1
    assert row["rollout/episode_retries"] == 4  # its 2 episodes, each played again twice in a fresh session
    assert capsys.readouterr().out.count("the game server is down") == 1  # named once, then counted
    run_ppo.main(with_agent(agent_args(tmp_path / "edits", tiny_model_dir, "--max_steps", "1"),
                            f"{agents_file}:edits_its_history"))
    row = read_metrics(tmp_path / "edits")[0]
    assert row["agent/prefix_breaks"] == 1 and row["agent/calls"] == 3 and row["rollout/failed_episodes"] == 0
    assert row["env/turns"] == 1  # the trajectory trained is the last sample: one call


@pytest.mark.parametrize("name, timeout, message", [
    ("always_raises", "300", "4 of 4 episodes failed (key 'max_agent_error_fraction' 0.5); the first: RuntimeError: "
                             "cannot reach the game"),
    ("sleeps", "1", "4 of 4 episodes failed (key 'max_agent_error_fraction' 0.5); the first: timed out after 1 s"),
])
def test_too_many_failed_episodes_stop_the_run_in_one_line(tmp_path, tiny_model_dir, agents_file, name, timeout,
                                                           message):
    args = with_agent(agent_args(tmp_path / "out", tiny_model_dir, "--max_steps", "1", "--num_return_sequences",
                                 "2", "--per_device_prompt_batch_size", "2", "--agent_timeout", timeout),
                      f"{agents_file}:{name}")
    done = subprocess.run([sys.executable, os.path.join(REPO, "alignment", "ppo", "run_ppo.py"), *args], cwd=REPO,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 2, done.stderr[-2000:]
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("error: ") and last.endswith(message) and f"{agents_file}:{name}" in last
    assert "Traceback" not in done.stderr


def test_agent_keys_are_checked_before_anything_loads(tmp_path, tiny_model_dir, agents_file):
    script = os.path.join(REPO, "alignment", "ppo", "run_ppo.py")
    cases = [(["--environment", "guess-number"], "keys 'agent' and 'environment' are both set"),
             (["--environment_args", '{"tools": ["calculator"]}'], "with 'agent' only 'format'"),
             (["--agent", "no_colon"], "key 'agent' must be 'module:function' or 'file.py:function'"),
             (["--agent", f"{agents_file}:missing"], f"key 'agent': {agents_file!r} has no function 'missing'")]
    for extra, message in cases:
        args = agent_args(tmp_path / "out", tiny_model_dir) + extra
        done = subprocess.run([sys.executable, script, *args], cwd=REPO, capture_output=True, text=True, timeout=300)
        assert done.returncode == 2 and message in done.stderr.strip().splitlines()[-1], done.stderr[-1500:]
        assert not (tmp_path / "out").exists()


def test_the_calculator_agent_plays_the_tools_environments_episode_token_for_token(tiny_model_dir):
    """examples/openai_agent/calculator_agent.py through the gateway against the `tools` environment, the model
    scripted to make a call, then a malformed call, then answer: the same ids, masks and log-probs."""
    import numpy as np

    from alignment.envs import ToolEnvironment
    from alignment.envs.multiturn import multi_turn_rollout
    from alignment.envs.formats import tool_call_format
    from alignment.models import GenerationConfig, LlamaForCausalLM, Tokenizer
    from alignment.data import import_function
    from tests.scripted_model import Scripted, agent_session

    play = import_function(os.path.join(REPO, "examples", "openai_agent", "calculator_agent.py:play"), "agent")

    model, tokenizer = LlamaForCausalLM.from_pretrained(tiny_model_dir), Tokenizer.from_pretrained(tiny_model_dir)
    model.eval()
    script = (tokenizer.encode('<tool_call>{"name": "calculator", "arguments": {"expression": "12 * 5"}}</tool_call>')
              + tokenizer.encode('<tool_call>{"name": calculator}</tool_call>')
              + tokenizer.encode("It is 60.") + [tokenizer.eos_token_id])
    config = GenerationConfig(max_new_tokens=64, do_sample=False, eos_token_id=tokenizer.eos_token_id,
                              pad_token_id=tokenizer.pad_token_id)
    row = {"input": "What is 12 * 5?", "answer": "60"}
    env = ToolEnvironment(tools=["calculator"], format="hermes-compact")
    expected = multi_turn_rollout(Scripted(model, script), tokenizer, [env], [row], config, 3, 500, max_length=700)[0]
    assert expected.num_turns == 3 and expected.tool_errors == 1  # a call, a malformed call, the answer

    session = agent_session(play, Scripted(model, script), tokenizer, tool_call_format("hermes-compact"), config,
                            row, 500, 700)
    got = session.sample
    assert session.prefix_breaks == 0 and got.num_turns == 3
    assert got.input_ids == expected.input_ids and got.action_mask == expected.action_mask
    np.testing.assert_array_equal(got.log_probs, expected.log_probs)
    # env/tool_calls as the environment counts it: the malformed call too (it was answered with an error)
    assert got.metrics["tool_calls"] == expected.metrics["tool_calls"] == 2.0
