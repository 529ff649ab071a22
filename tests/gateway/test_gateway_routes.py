"""The gateway's three protocols (alignment/gateway/route.py: chat completions, OpenAI Responses, Anthropic Messages):
one conversation renders to the same prompt tokens on each; tool calls, finishes and stop reasons carried in each;
streamed events add up to the unstreamed response; bad requests get 400 in the protocol's error shape."""
import json
import types

import pytest
from fastapi.testclient import TestClient

from alignment.envs.chat import prompt_text
from alignment.envs.formats import tool_call_format
from alignment.gateway import render
from alignment.gateway.app import create_app
from alignment.gateway.outcome import Choice, Outcome
from alignment.gateway.protocol import GatewayError, Limits, Message, ToolCallMessage
from alignment.gateway.route import ROUTES

HERMES = tool_call_format("hermes")
SCHEMA = {"type": "object", "properties": {"expression": {"type": "string"}}, "required": ["expression"]}
CALL = {"expression": "12 * 5"}

CHAT = {"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 12 * 5?"},
                     {"role": "assistant", "content": "Let me compute.", "tool_calls": [
                         {"id": "call_0", "type": "function",
                          "function": {"name": "calculator", "arguments": json.dumps(CALL)}}]},
                     {"role": "tool", "tool_call_id": "call_0", "content": "60"},
                     {"role": "user", "content": "And the answer?"}],
        "tools": [{"type": "function", "function": {"name": "calculator", "description": "Evaluate arithmetic.",
                                                    "parameters": SCHEMA}}]}
RESPONSES = {"instructions": "Be brief.",
             "input": [{"role": "user", "content": "What is 12 * 5?"},
                       {"type": "message", "role": "assistant", "id": "msg_1", "status": "completed",
                        "content": [{"type": "output_text", "text": "Let me compute.", "annotations": []}]},
                       {"type": "function_call", "id": "fc_1", "call_id": "call_0", "name": "calculator",
                        "arguments": json.dumps(CALL), "status": "completed"},
                       {"type": "function_call_output", "call_id": "call_0", "output": "60"},
                       {"role": "user", "content": [{"type": "input_text", "text": "And the answer?"}]}],
             "tools": [{"type": "function", "name": "calculator", "description": "Evaluate arithmetic.",
                        "parameters": SCHEMA}]}
MESSAGES = {"system": "Be brief.", "max_tokens": 64,
            "messages": [{"role": "user", "content": "What is 12 * 5?"},
                         {"role": "assistant", "content": [{"type": "text", "text": "Let me compute."},
                                                           {"type": "tool_use", "id": "toolu_1", "name": "calculator",
                                                            "input": CALL}]},
                         {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1",
                                                       "content": "60"},
                                                      {"type": "text", "text": "And the answer?"}]}],
             "tools": [{"name": "calculator", "description": "Evaluate arithmetic.", "input_schema": SCHEMA}]}
BODIES = {"chat/completions": CHAT, "responses": RESPONSES, "messages": MESSAGES}


def test_one_conversation_renders_to_the_same_prompt_tokens_on_every_route(tiny_model_dir):
    from alignment.models import Tokenizer

    tokenizer = Tokenizer.from_pretrained(tiny_model_dir)
    assert set(ROUTES) == set(BODIES)
    shown = {path: render.shown(req.messages, req.tools, HERMES) for path, req in
             ((path, ROUTES[path].parse(body, Limits())) for path, body in BODIES.items())}
    ids = {path: tokenizer.encode(prompt_text(tokenizer, s), add_special_tokens=True) for path, s in shown.items()}
    assert shown["responses"] == shown["messages"] == shown["chat/completions"]
    assert ids["responses"] == ids["messages"] == ids["chat/completions"]
    assert '"parameters": {"type": "object"' in shown["messages"][0]["content"]  # the tool as chat shows it
    assert [m["role"] for m in shown["messages"]] == ["system", "user", "assistant", "tool", "user"]


def outcome(ending, text="The answer is 60.", calls=(), logprobs=None):
    message = Message("assistant", render.cut(text, ("END",)), tuple(
        ToolCallMessage(f"call_{i}", name, args) for i, (name, args) in enumerate(calls)))
    return Outcome("s-1", "tiny", 0, (Choice(message, ending, text, (5, 6, 7), logprobs),), 11, 3)


@pytest.mark.parametrize("ending, calls, chat, responses, messages", [
    ("eos", (), "stop", ("completed", None), ("end_turn", None)),
    ("stop", (), "stop", ("completed", None), ("stop_sequence", "END")),
    ("length", (), "length", ("incomplete", "max_output_tokens"), ("max_tokens", None)),
    ("budget", (), "length", ("incomplete", "max_output_tokens"), ("max_tokens", None)),
    ("stop", (("calculator", CALL),), "tool_calls", ("completed", None), ("tool_use", None)),
])
def test_every_route_carries_the_finish_of_a_turn(ending, calls, chat, responses, messages):
    text = "The answer END is 60." if ending == "stop" and not calls else "The answer is 60."
    done = outcome(ending, text, calls)
    bodies = {"chat/completions": {**CHAT, "stop": ["END"]}, "responses": RESPONSES,
              "messages": {**MESSAGES, "stop_sequences": ["END"]}}  # Responses has no stop sequences
    requests = {path: ROUTES[path].parse(body, Limits()) for path, body in bodies.items()}
    answers = {path: ROUTES[path].response(done, requests[path]) for path in ROUTES}
    assert answers["chat/completions"]["choices"][0]["finish_reason"] == chat
    got = answers["responses"]
    assert (got["status"], (got["incomplete_details"] or {}).get("reason")) == responses
    assert (answers["messages"]["stop_reason"], answers["messages"]["stop_sequence"]) == messages


def test_a_tool_call_comes_back_on_every_route_as_the_same_message():
    done = outcome("stop", "Let me compute.", [("calculator", CALL)])
    chat = ROUTES["chat/completions"].response(done, ROUTES["chat/completions"].parse(CHAT, Limits()))
    responses = ROUTES["responses"].response(done, ROUTES["responses"].parse(RESPONSES, Limits()))
    messages = ROUTES["messages"].response(done, ROUTES["messages"].parse(MESSAGES, Limits()))
    assert [i["type"] for i in responses["output"]] == ["message", "function_call"]
    assert json.loads(responses["output"][1]["arguments"]) == CALL and messages["content"][1]["input"] == CALL
    ask = [{"role": "user", "content": "q"}]
    again = {"chat/completions": {"messages": ask + [chat["choices"][0]["message"]]},
             "responses": {"input": ask + responses["output"]},
             "messages": {"max_tokens": 8, "messages": ask + [{"role": "assistant", "content": messages["content"]}]}}
    parsed = {path: ROUTES[path].parse(body, Limits()).messages[-1] for path, body in again.items()}
    key = {path: (m.role, m.content, [(c.name, c.arguments) for c in m.tool_calls]) for path, m in parsed.items()}
    assert key["responses"] == key["messages"] == key["chat/completions"] == (
        "assistant", "Let me compute.", [("calculator", CALL)])


def sse(lines):
    """(event name or None, data) of a stream's events."""
    events = []
    for raw in "".join(lines).split("\n\n")[:-1]:
        fields = dict(line.split(": ", 1) for line in raw.split("\n"))
        events.append((fields.get("event"), fields["data"] if fields["data"] == "[DONE]" else
                       json.loads(fields["data"])))
    return events


@pytest.mark.parametrize("calls", [(), (("calculator", CALL),)])
def test_streamed_events_add_up_to_the_unstreamed_response(calls):
    logprobs = tuple({"token": t, "logprob": -0.5, "bytes": list(t.encode()), "top_logprobs": []} for t in "abc")
    done = outcome("length" if not calls else "stop", "Let me compute.", calls, logprobs)
    route = ROUTES["chat/completions"]
    request = route.parse({**CHAT, "stream": True, "stream_options": {"include_usage": True}}, Limits())
    events = sse(route.events(done, request))
    whole = route.response(done, request)["choices"][0]
    assert events[-1] == (None, "[DONE]") and events[-2][1]["usage"] == route.response(done, request)["usage"]
    deltas = [e[1]["choices"][0] for e in events[:-2]]
    assert "".join(d["delta"].get("content") or "" for d in deltas) == (whole["message"]["content"] or "")
    assert [c for d in deltas for c in d["delta"].get("tool_calls", [])] == [
        {"index": j, **c} for j, c in enumerate(whole["message"].get("tool_calls", []))]
    assert [d["finish_reason"] for d in deltas if d["finish_reason"]] == [whole["finish_reason"]]
    assert [t for d in deltas if d["logprobs"] for t in d["logprobs"]["content"]] == list(logprobs)

    route = ROUTES["responses"]
    request = route.parse({**RESPONSES, "stream": True}, Limits())
    events = sse(route.events(done, request))
    assert all(name == data["type"] for name, data in events)
    assert [data["sequence_number"] for _, data in events] == list(range(len(events)))
    assert events[-1][1]["response"] == route.response(done, request)
    assert events[-1][0] == ("response.incomplete" if not calls else "response.completed")
    assert [d["item"] for _, d in events if d["type"] == "response.output_item.done"] == events[-1][1]["response"][
        "output"]

    route = ROUTES["messages"]
    request = route.parse({**MESSAGES, "stream": True}, Limits())
    events = sse(route.events(done, request))
    whole = route.response(done, request)
    assert [name for name, _ in events][:1] + [name for name, _ in events][-2:] == [
        "message_start", "message_delta", "message_stop"]
    blocks = [dict(d["content_block"]) for _, d in events if d["type"] == "content_block_start"]
    for _, d in events:
        if d["type"] == "content_block_delta":
            delta = d["delta"]
            if delta["type"] == "text_delta":
                blocks[d["index"]]["text"] += delta["text"]
            else:
                blocks[d["index"]]["input"] = json.loads(delta["partial_json"])
    assert blocks == whole["content"]
    assert events[-2][1]["delta"] == {"stop_reason": whole["stop_reason"], "stop_sequence": whole["stop_sequence"]}


BAD = {"chat/completions": [({"messages": []}, "'messages' must be a non-empty list"),
                            ({**CHAT, "stream": "yes"}, "'stream' must be true or false")],
       "responses": [({"input": [{"type": "reasoning", "summary": []}]}, "input[0] must be an item of type"),
                     ({**RESPONSES, "previous_response_id": "resp_1"}, "'previous_response_id' is not served"),
                     ({**RESPONSES, "tools": [{"type": "web_search"}]}, "'tools' must be a list of"),
                     ({**RESPONSES, "temperature": 9}, "'temperature' must be in [0, 2]")],
       "messages": [({**MESSAGES, "max_tokens": None}, "'max_tokens' is required"),
                    ({**MESSAGES, "messages": [{"role": "user", "content": [{"type": "image"}]}]},
                     "messages[0].content[0] must be a text block or a tool_result block"),
                    ({**MESSAGES, "tools": [{"type": "bash_20250124", "name": "bash"}]}, "tools[0] must be"),
                    ({**MESSAGES, "stop_sequences": "END"}, "'stop_sequences' must be a list")]}


def error_of(path, answer):
    """(type, message) of a route's error answer, checked to be the protocol's shape."""
    body = answer.json()
    if path == "messages":
        assert body["type"] == "error" and set(body["error"]) <= {"type", "message", "code"}, body
    else:
        assert set(body["error"]) == {"message", "type", "param", "code"}, body
    return body["error"]["type"], body["error"]["message"]


@pytest.mark.parametrize("path", sorted(BAD))
def test_bad_requests_get_400_in_the_protocols_error_shape(path):
    client = TestClient(create_app(types.SimpleNamespace(model_name="tiny"), "k"))
    for body, words in BAD[path]:
        for url in (f"/v1/{path}", f"/sessions/s/v1/{path}"):
            answer = client.post(url, json=body, headers={"Authorization": "Bearer k"})
            kind, message = error_of(path, answer)
            assert answer.status_code == 400 and kind == "invalid_request_error" and words in message, answer.text
            assert "\n" not in message
    answer = client.post(f"/v1/{path}", json=BODIES[path], headers={"x-api-key": "wrong"})
    assert answer.status_code == 401 and "missing or wrong API key" in error_of(path, answer)[1]
    assert error_of(path, answer)[0] == ("authentication_error" if path == "messages" else "invalid_request_error")
    with pytest.raises(GatewayError) as caught:
        ROUTES[path].parse(BODIES[path] | ({"input": [{"role": "user", "content": "x"}] * 3} if path == "responses"
                                           else {"messages": [{"role": "user", "content": "x"}] * 3}),
                           Limits(max_messages=2))
    assert caught.value.status == 413
