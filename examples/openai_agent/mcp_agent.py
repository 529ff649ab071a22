"""An agent program whose tools are served by an MCP server: an OpenAI client that lists the server's tools as
its `tools` and runs each call the model makes on the server.

    agent: "examples/openai_agent/mcp_agent.py:play"
    environment_args: {"format": "hermes-compact"}   # how the gateway shows the tools and parses calls

It plays what the `tools` environment plays with `{"tools": [{"mcp": SERVER}]}`: the question, then each turn's
tool calls answered with their results (or the same error texts), until a turn without a call (the answer; the
run's reward functions score it) or 3 turns. SERVER is examples/mcp_arith_server.py, started over stdio once per
process under the python sandbox's limits (alignment/envs/mcp_tools.py).
"""
import json
import os
import sys

import openai

from alignment import ToolCall, run_tool_call, tool_call_format
from alignment.envs.mcp_tools import connected

SERVER = {"command": sys.executable, "args": [os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir,
                                                           "mcp_arith_server.py")]}
TURNS = 3
FORMAT = tool_call_format("hermes-compact")


def play(base_url, api_key, row):
    server = connected(SERVER)
    tools = {tool.name: tool for tool in server.tools()}
    client = openai.OpenAI(base_url=base_url, api_key=api_key, max_retries=0)
    messages = [{"role": "user", "content": row["input"]}]
    for _ in range(TURNS):
        try:
            message = client.chat.completions.create(model="policy", messages=messages,
                                                     tools=server.schemas()).choices[0].message
        except openai.BadRequestError as err:
            if err.code == "context_length_exceeded":  # the episode's token budget is spent: it ends here
                return None
            raise
        messages.append(message.model_dump(include={"role", "content", "tool_calls"}, exclude_none=True))
        calls = [ToolCall(c.function.name, json.loads(c.function.arguments)) for c in message.tool_calls or []]
        calls = calls or FORMAT.parse(message.content or "")  # malformed calls: the environment's error texts
        if not calls:
            return None
        for i, call in enumerate(calls):
            messages.append({"role": "tool", "tool_call_id": f"call_{i}", "content": run_tool_call(call, tools).content})
    return None
