"""The tool demo's calculator task (examples/tool_demo.sh) as an agent program: an OpenAI client with one tool.

    agent: "examples/openai_agent/calculator_agent.py:play"
    environment_args: {"format": "hermes-compact"}   # how the gateway shows the tool and parses calls

It plays what the `tools` environment plays: the question, then each turn's tool calls answered with their
results, until a turn without a call (the answer; the run's `accuracy` reward function scores it) or 3 turns.
The calculator and its error texts are the environment's (`alignment.envs`); a call the gateway could not parse
comes back as plain content, and is answered as the environment answers it, so both arms see the same turns.
When the episode's token budget cuts an answer the gateway refuses the next call (`context_length_exceeded`) and
the episode ends there, as the environment's does.
"""
import json

import openai

from alignment import BUILTIN_TOOLS, ToolCall, run_tool_call, tool_call_format

TURNS = 3
CALCULATOR = BUILTIN_TOOLS["calculator"]
FORMAT = tool_call_format("hermes-compact")
MAX_CALLS = 4  # per turn, as the environment runs them


def play(base_url, api_key, row):
    client = openai.OpenAI(base_url=base_url, api_key=api_key, max_retries=0)
    turns = row["input"] if isinstance(row["input"], list) else [row["input"]]
    messages = [{"role": "user" if i % 2 == 0 else "assistant", "content": t} for i, t in enumerate(turns)]
    for _ in range(TURNS):
        try:
            message = client.chat.completions.create(model="policy", messages=messages,
                                                     tools=[CALCULATOR.schema]).choices[0].message
        except openai.BadRequestError as err:
            if err.code == "context_length_exceeded":  # the episode's token budget is spent: it ends here
                return None
            raise
        messages.append(message.model_dump(include={"role", "content", "tool_calls"}, exclude_none=True))
        calls = [ToolCall(c.function.name, json.loads(c.function.arguments)) for c in message.tool_calls or []]
        calls = calls or FORMAT.parse(message.content or "")  # malformed calls: the environment's error texts
        if not calls:
            return None  # the answer: the run's reward functions judge it
        for i, call in enumerate(calls):
            if i >= MAX_CALLS:
                call = ToolCall("", {}, f"at most {MAX_CALLS} tool calls per turn; this one was not run")
            messages.append({"role": "tool", "tool_call_id": f"call_{i}",
                             "content": run_tool_call(call, {"calculator": CALCULATOR}).content})
    return None
