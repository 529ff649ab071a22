"""Tools served by an MCP server (alignment/envs/mcp_tools.py), with the real `mcp` package (1.x or 2.x): a server
written here, started over stdio (under the python sandbox's rlimits) and served over streamable HTTP on 127.0.0.1,
its tools listed with their own schemas and called by the `tools` environment as our own tools are, and by plain
code as an agent program calls them; and a tiny GRPO step with them."""
import json
import os
import resource
import socket
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

pytest.importorskip("mcp", reason="the mcp package is not installed (requirements.txt installs it)")

from alignment.envs import checked_reset, checked_step, environment_factory  # noqa: E402
from alignment.envs.mcp_tools import MCPServer  # noqa: E402
from alignment.ppo import run_ppo  # noqa: E402
from tests.helpers import REPO, read_metrics  # noqa: E402

SERVER = textwrap.dedent(f'''
    # the example server's tools (add, multiply) and two of the test's own
    import resource
    import sys
    sys.path.insert(0, {os.path.join(REPO, "examples")!r})
    from mcp_arith_server import serve, server

    @server.tool()
    def divide(a: float, b: float) -> float:
        """Divide a by b."""
        return a / b

    @server.tool()
    def limits() -> str:
        """This process's address-space and file-size limits."""
        return f"{{resource.getrlimit(resource.RLIMIT_AS)[0]}} {{resource.getrlimit(resource.RLIMIT_FSIZE)[0]}}"

    if __name__ == "__main__":
        serve()
''')
CALL = '<tool_call>{"name": "%s", "arguments": %s}</tool_call>'


@pytest.fixture(scope="module")
def server_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("mcp") / "arith_server.py"
    path.write_text(SERVER)
    return str(path)


@pytest.fixture(scope="module")
def http_url(server_file):
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    proc = subprocess.Popen([sys.executable, server_file, "--http", str(port)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    deadline = time.time() + 30
    while time.time() < deadline:
        with socket.socket() as probe:
            if probe.connect_ex(("127.0.0.1", port)) == 0:
                break
        time.sleep(0.1)
    yield f"http://127.0.0.1:{port}/mcp"
    proc.terminate()
    proc.wait(10)


def stdio(server_file, **more):
    return {"command": sys.executable, "args": [server_file], **more}


def test_a_stdio_server_lists_its_tools_with_their_own_schemas_and_runs_under_the_sandbox_limits(server_file):
    server = MCPServer(stdio(server_file, limits={"memory_bytes": 3 << 30, "file_bytes": 1 << 20}))
    schemas = {schema["function"]["name"]: schema for schema in server.schemas()}
    assert sorted(schemas) == ["add", "divide", "limits", "multiply"]
    add = schemas["add"]["function"]
    assert add["description"] == "Add two integers."
    assert add["parameters"]["required"] == ["a", "b"]
    assert add["parameters"]["properties"]["a"]["type"] == "integer"
    assert server.call("add", {"a": 2, "b": 3}) == "5"
    assert server.call("limits") == f"{3 << 30} {1 << 20}"  # the rlimits it was started under
    server.close()
    own = MCPServer(stdio(server_file))
    assert own.call("limits") == f"{1 << 30} {16 << 20}"  # the python sandbox's defaults (SandboxLimits)
    assert resource.getrlimit(resource.RLIMIT_AS)[0] != 1 << 30  # ours are left as they were
    own.close()


def test_the_tools_environment_calls_stdio_and_http_servers_like_its_own_tools(server_file, http_url):
    env = environment_factory("tools", {"tools": ["calculator", {"mcp": stdio(server_file, tools=["add"])},
                                                  {"mcp": {"url": http_url, "tools": ["divide"]}}]})()
    prompt = checked_reset(env, {"input": "What is 2 + 3?"})
    assert '"name": "add"' in prompt[0]["content"] and '"name": "divide"' in prompt[0]["content"]
    assert '"name": "limits"' not in prompt[0]["content"]  # not asked for
    result = checked_step(env, CALL % ("add", '{"a": 2, "b": 3}') + CALL % ("divide", '{"a": 1, "b": 4}'))
    assert [m["content"] for m in result.observation] == ["5", "0.25"] and result.metrics["tool_errors"] == 0
    broken = checked_step(env, CALL % ("divide", '{"a": 1, "b": 0}') + CALL % ("add", '{"a": "x"}'))
    assert [m["content"].startswith("Error: tool 'divide' raised MCPToolError") for m in broken.observation] == \
        [True, False] and "division by zero" in broken.observation[0]["content"]
    assert broken.observation[1]["content"].startswith("Error: tool 'add' raised MCPToolError")  # server-checked
    assert broken.metrics["tool_errors"] == 2
    assert checked_step(env, "It is 5.").done


def test_an_agent_program_lists_and_calls_the_servers_tools(http_url):
    server = MCPServer({"url": http_url})
    tools = server.schemas()  # what an agent passes as `tools=` to its model calls
    assert {tool["function"]["name"] for tool in tools} == {"add", "divide", "limits", "multiply"}
    assert server.call("divide", {"a": 3, "b": 2}) == "1.5"
    server.close()


def test_bad_server_entries_stop_in_one_line(server_file, tmp_path):
    cases = [({"mcp": {"url": "http://x", "command": "y"}}, "give one of 'command'"),
             ({"mcp": stdio(server_file, tools=["nope"])}, "has no tool 'nope'"),
             ({"mcp": stdio(server_file, limits={"wall_seconds": 3})}, "'limits' has 'wall_seconds'"),
             ({"mcp": {"command": str(tmp_path / "missing")}}, "cannot connect"),
             ({"server": {}}, "a mapping entry is")]
    for entry, message in cases:
        with pytest.raises(ValueError, match=message) as refused:
            environment_factory("tools", {"tools": [entry]})
        assert "\n" not in str(refused.value)


def test_a_tiny_grpo_step_with_mcp_tools(tmp_path, tiny_model_dir, server_file):
    data = tmp_path / "rows.jsonl"
    data.write_text('{"prompt": "What is 2 + 3?", "answer": "5"}\n{"prompt": "What is 40 + 2?", "answer": "42"}\n')
    out = tmp_path / "out"
    run_ppo.main([os.path.join(REPO, "config", "tiny", "grpo_tools_argument.json"), "--actor_model_name_or_path",
                  tiny_model_dir, "--output_dir", str(out), "--disable_tqdm", "--environment", "tools",
                  "--environment_args", json.dumps({"tools": [{"mcp": stdio(server_file, tools=["add"])}],
                                                         "format": "hermes-compact"}),
                  "--max_turns", "2", "--max_new_tokens", "6", "--max_length", "1024", "--max_trajectory_tokens", "48",
                  "--num_return_sequences", "2", "--per_device_prompt_batch_size", "2",
                  "--per_device_train_batch_size", "4", "--max_steps", "1", "--eval_datasets", "", "--logging_steps",
                  "1", "--save_steps", "0", "--train_datasets", f"prompt-only:1.0:{data}"])
    rows = [row for row in read_metrics(out) if "actor_loss" in row]
    assert len(rows) == 1 and np.isfinite(rows[0]["actor_loss"]) and 1 <= rows[0]["env/turns"] <= 2


def test_an_agent_with_mcp_tools_plays_the_tools_environments_episode_token_for_token(tiny_model_dir):
    """examples/openai_agent/mcp_agent.py through the gateway against the `tools` environment with the same MCP
    server, the model scripted to call `add`, then `multiply` with a bad argument, then answer: the same ids, masks
    and log-probs."""
    from alignment.data import import_function
    from alignment.envs import ToolEnvironment
    from alignment.envs.formats import tool_call_format
    from alignment.envs.multiturn import multi_turn_rollout
    from alignment.models import GenerationConfig, LlamaForCausalLM, Tokenizer
    from tests.scripted_model import Scripted, agent_session

    agent = os.path.join(REPO, "examples", "openai_agent", "mcp_agent.py")
    play = import_function(f"{agent}:play", "agent")
    spec = play.__globals__["SERVER"]
    model, tokenizer = LlamaForCausalLM.from_pretrained(tiny_model_dir), Tokenizer.from_pretrained(tiny_model_dir)
    model.eval()
    script = (tokenizer.encode('<tool_call>{"name": "add", "arguments": {"a": 12, "b": 5}}</tool_call>')
              + tokenizer.encode('<tool_call>{"name": "multiply", "arguments": {"a": "x", "b": 2}}</tool_call>')
              + tokenizer.encode("It is 17.") + [tokenizer.eos_token_id])
    config = GenerationConfig(max_new_tokens=64, do_sample=False, eos_token_id=tokenizer.eos_token_id,
                              pad_token_id=tokenizer.pad_token_id)
    row = {"input": "What is 12 + 5?", "answer": "17"}
    env = ToolEnvironment(tools=[{"mcp": spec}], format="hermes-compact")
    expected = multi_turn_rollout(Scripted(model, script), tokenizer, [env], [row], config, 3, 700, max_length=900)[0]
    assert expected.num_turns == 3 and expected.tool_errors == 1  # a call, a call the server refused, the answer
    results = [m["content"] for m in expected.messages if m["role"] == "tool"]
    assert results[0] == "17" and results[1].startswith("Error: tool 'multiply' raised MCPToolError")

    session = agent_session(play, Scripted(model, script), tokenizer, tool_call_format("hermes-compact"), config,
                            row, 700, 900)
    got = session.sample
    assert session.prefix_breaks == 0 and got.num_turns == 3
    assert got.input_ids == expected.input_ids and got.action_mask == expected.action_mask
    np.testing.assert_array_equal(got.log_probs, expected.log_probs)
