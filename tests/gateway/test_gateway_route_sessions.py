"""Training sessions through every route of the gateway with the real clients (`openai` chat completions and
Responses, `anthropic` Messages), streamed and not: the same tokens, log-probs and recorded turns as the unstreamed
chat call; a tool game played token for token the same on every route; a turn the budget cuts ends the episode
with each protocol's signal."""
import json
import threading

import anthropic
import numpy as np
import openai
import pytest

from alignment.envs import BUILTIN_TOOLS, ToolCall, run_tool_call
from alignment.gateway.app import GatewayServer, create_app

KEY = "k"
ROUTES = ("chat", "responses", "messages")
CALCULATOR = BUILTIN_TOOLS["calculator"]
FUNCTION = CALCULATOR.schema["function"]


def play(gateway, sessions: dict):
    """Run agent(base_url) of each session in its own thread while this thread pumps; -> their results."""
    server = GatewayServer(create_app(gateway, KEY))
    results = {}

    def run(name, agent):
        try:
            results[name] = agent(f"{server.base_url}/sessions/{name}/v1")
        except Exception as err:  # noqa: BLE001 - reported by the test
            results[name] = err

    for name, agent in sessions.items():
        threading.Thread(target=run, args=(name, agent), daemon=True).start()
    gateway.pump(lambda: len(results) == len(sessions))
    server.stop()
    return results


def ask(route, stream, url, conversation, tools=False, max_tokens=None):
    """One call of `route` -> (text, log-probs or None, calls [(id, name, arguments)], the route's finish)."""
    if route == "messages":
        client = anthropic.Anthropic(base_url=url.removesuffix("/v1"), api_key=KEY, max_retries=0)
        kwargs = dict(model="p", max_tokens=max_tokens or 1024, messages=conversation,
                      tools=[{"name": FUNCTION["name"], "description": FUNCTION["description"],
                              "input_schema": FUNCTION["parameters"]}] if tools else anthropic.omit)
        if stream:
            with client.messages.stream(**kwargs) as events:
                reply = events.get_final_message()
        else:
            reply = client.messages.create(**kwargs)
        text = "".join(b.text for b in reply.content if b.type == "text")
        calls = [(b.id, b.name, b.input) for b in reply.content if b.type == "tool_use"]
        return text, None, calls, reply.stop_reason, reply
    client = openai.OpenAI(base_url=url, api_key=KEY, max_retries=0)
    if route == "responses":
        kwargs = dict(model="p", input=conversation, include=["message.output_text.logprobs"],
                      tools=[{"type": "function", **FUNCTION}] if tools else openai.omit,
                      max_output_tokens=max_tokens or openai.omit)
        if stream:
            events = list(client.responses.create(**kwargs, stream=True))
            reply = events[-1].response
            streamed = "".join(e.delta for e in events if e.type == "response.output_text.delta")
            assert streamed == reply.output_text
        else:
            reply = client.responses.create(**kwargs)
        parts = [p for item in reply.output if item.type == "message" for p in item.content]
        calls = [(i.call_id, i.name, json.loads(i.arguments)) for i in reply.output if i.type == "function_call"]
        return reply.output_text, [t.logprob for p in parts for t in p.logprobs], calls, reply.status, reply
    kwargs = dict(model="p", messages=conversation, logprobs=True, max_tokens=max_tokens or openai.omit,
                  tools=[CALCULATOR.schema] if tools else openai.omit)
    if not stream:
        choice = client.chat.completions.create(**kwargs).choices[0]
        calls = [(c.id, c.function.name, json.loads(c.function.arguments)) for c in choice.message.tool_calls or []]
        return choice.message.content or "", [t.logprob for t in choice.logprobs.content], calls, \
            choice.finish_reason, choice.message
    chunks = [c.choices[0] for c in client.chat.completions.create(**kwargs, stream=True) if c.choices]
    calls = [(c.id, c.function.name, json.loads(c.function.arguments)) for ch in chunks
             for c in ch.delta.tool_calls or []]
    return "".join(c.delta.content or "" for c in chunks), [t.logprob for c in chunks if c.logprobs
                                                            for t in c.logprobs.content], calls, \
        chunks[-1].finish_reason, None


def followed(route, conversation, reply, text, calls, results):
    """The conversation after a turn and its tool results (or a user's nudge), as the route writes it."""
    if route == "messages":
        blocks = [b.model_dump(exclude_none=True, include={"type", "text", "id", "name", "input"})
                  for b in reply.content]
        answer = ([{"type": "tool_result", "tool_use_id": i, "content": r} for (i, _, _), r in zip(calls, results)]
                  or [{"type": "text", "text": "go on"}])
        return conversation + [{"role": "assistant", "content": blocks}, {"role": "user", "content": answer}]
    if route == "responses":
        back = [item.model_dump(exclude_none=True) for item in reply.output] if reply is not None else []
        answer = ([{"type": "function_call_output", "call_id": i, "output": r} for (i, _, _), r in zip(calls, results)]
                  or [{"role": "user", "content": "go on"}])
        return conversation + back + answer
    message = {"role": "assistant", "content": text}
    if calls:
        message["tool_calls"] = [{"id": i, "type": "function", "function": {"name": n, "arguments": json.dumps(a)}}
                                 for i, n, a in calls]
    answer = ([{"role": "tool", "tool_call_id": i, "content": r} for (i, _, _), r in zip(calls, results)]
              or [{"role": "user", "content": "go on"}])
    return conversation + [message] + answer


def game(route, stream, tools=False, turns=2):
    """An agent of `route`: `turns` calls, each turn's tool calls run (calculator) or nudged on."""
    def agent(url):
        conversation, seen = [{"role": "user", "content": "What is 12 * 5?"}], []
        for _ in range(turns):
            text, logprobs, calls, finish, reply = ask(route, stream, url, conversation, tools)
            seen.append((text, logprobs, [(n, a) for _, n, a in calls], finish))
            results = [run_tool_call(ToolCall(n, a), {"calculator": CALCULATOR}).content for _, n, a in calls]
            conversation = followed(route, conversation, reply, text, calls, results)
        return seen
    return agent


@pytest.fixture(scope="module")
def tiny(tiny_model_dir):
    from alignment.models import LlamaForCausalLM, Tokenizer

    model = LlamaForCausalLM.from_pretrained(tiny_model_dir)
    model.eval()
    return model, Tokenizer.from_pretrained(tiny_model_dir)


def recorded(session):
    return [(c["fed"], c["sampled"], c["log_probs"], c["ending"]) for c in session.calls], \
        [(s.input_ids, s.action_mask, s.log_probs) for s in session.samples]


def test_every_route_streamed_or_not_records_the_turns_of_the_chat_call(tiny):
    from alignment.gateway.serving import build_gateway

    gateway = build_gateway(*tiny, 6, 512, 8)
    names = [f"{route}-{stream}" for route in ROUTES for stream in (False, True)]
    for name in names:
        gateway.open_session(name, np.random.default_rng(5))
    seen = play(gateway, {name: game(name.split("-")[0], name.endswith("True")) for name in names})
    baseline = recorded(gateway.sessions["chat-False"])
    assert len(baseline[0]) == 2 and len(baseline[1]) == 1  # two calls, one trajectory
    for name in names:
        assert not isinstance(seen[name], Exception), (name, seen[name])
        assert recorded(gateway.sessions[name]) == baseline, name
        texts = [(text, finish) for text, _, _, finish in seen[name]]
        assert [t for t, _ in texts] == [t for t, *_ in seen["chat-False"]], name
        if not name.startswith("messages"):
            assert [lp for _, lp, _, _ in seen[name]] == [lp for _, lp, _, _ in seen["chat-False"]], name
    assert [lp for _, lp, _, _ in seen["chat-False"]] == [c[2] for c in baseline[0]]  # the recorded log-probs


def test_a_tool_game_plays_token_for_token_the_same_on_every_route(tiny):
    """The model scripted to call the calculator, then answer: every route's agent sees the call, sends the result
    back in its protocol, and the episode's trajectory is the chat agent's."""
    from alignment.envs.formats import tool_call_format
    from alignment.gateway.backend import Gateway
    from alignment.models import GenerationConfig
    from tests.scripted_model import Scripted

    model, tokenizer = tiny
    script = (tokenizer.encode('<tool_call>{"name": "calculator", "arguments": {"expression": "12 * 5"}}</tool_call>')
              + tokenizer.encode("It is 60.") + [tokenizer.eos_token_id])
    config = GenerationConfig(max_new_tokens=64, do_sample=False, eos_token_id=tokenizer.eos_token_id,
                              pad_token_id=tokenizer.pad_token_id)
    trajectories = {}
    for route in ROUTES:
        for stream in (False, True):
            gateway = Gateway(Scripted(model, script), tokenizer, 1, 700, tool_call_format("hermes"),
                              lambda request: (config, 1.0))
            session = gateway.open_session("s", None, 500)
            seen = play(gateway, {"s": game(route, stream, tools=True)})["s"]
            assert not isinstance(seen, Exception), (route, stream, seen)
            assert seen[0][2] == [("calculator", {"expression": "12 * 5"})] and seen[1][0] == "It is 60."
            assert seen[0][3] == {"chat": "tool_calls", "responses": "completed", "messages": "tool_use"}[route]
            trajectories[route, stream] = recorded(session)
            assert session.prefix_breaks == 0 and session.sample.num_turns == 2
    assert all(t == trajectories["chat", False] for t in trajectories.values())


def test_a_turn_the_budget_cuts_ends_the_episode_on_every_route(tiny):
    from alignment.gateway.serving import build_gateway

    gateway = build_gateway(*tiny, 6, 256, 8)
    names = [f"{route}-{stream}" for route in ROUTES for stream in (False, True)]
    for name in names:
        gateway.open_session(name, np.random.default_rng(1), budget=3)

    def cut(route, stream):
        def agent(url):
            conversation = [{"role": "user", "content": "Count with me."}]
            text, _, _, finish, reply = ask(route, stream, url, conversation, max_tokens=8)
            try:
                ask(route, stream, url, followed(route, conversation, reply, text, [], []))
            except (openai.BadRequestError, anthropic.BadRequestError) as err:
                return finish, reply, err.status_code, err.body["error"].get("code") if route == "messages" \
                    else err.code
            return finish, reply, None, None
        return agent

    seen = play(gateway, {name: cut(name.split("-")[0], name.endswith("True")) for name in names})
    for name in names:
        route = name.split("-")[0]
        finish, reply, status, code = seen[name]
        assert finish == {"chat": "length", "responses": "incomplete", "messages": "max_tokens"}[route], name
        if route == "responses":
            assert reply.incomplete_details.reason == "max_output_tokens"
        assert (status, code) == (400, "context_length_exceeded"), name
        session = gateway.sessions[name]
        assert session.sample.truncated and len(session.calls) == 1 and len(session.calls[0]["sampled"]) == 3
