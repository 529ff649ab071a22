"""The OpenAI-compatible gateway (alignment/gateway): `alignment-serve` answered by the real `openai` client (the
engine's tokens, seeds, n, logprobs, the model list), errors shaped as OpenAI's for malformed, unauthorised and
oversized requests, tool calls parsed into `tool_calls`, and a session's calls continuing one trajectory on the
same KV cache."""
import json
import os
import subprocess
import sys
import threading
import time

import httpx
import numpy as np
import openai
import pytest

from alignment.envs.formats import tool_call_format
from alignment.gateway import render
from alignment.gateway.protocol import GatewayError, Limits, parse_chat_request
from tests.helpers import REPO

HERMES = tool_call_format("hermes")
KEY = "test-key"


@pytest.fixture(scope="module")
def server(tiny_model_dir, tmp_path_factory):
    port_file = tmp_path_factory.mktemp("serve") / "port"
    proc = subprocess.Popen([sys.executable, os.path.join(REPO, "tools", "serve.py"), "--model", tiny_model_dir,
                             "--port", "0", "--port-file", str(port_file), "--api-key", KEY, "--name", "tiny",
                             "--max-sequences", "4", "--max-length", "256", "--max-tokens", "24"],
                            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 120
    while not port_file.exists() and proc.poll() is None and time.time() < deadline:
        time.sleep(0.1)
    assert port_file.exists(), proc.stderr.read() if proc.poll() is not None else "no port file"
    yield f"http://127.0.0.1:{port_file.read_text().strip()}"
    proc.terminate()
    proc.wait(timeout=30)


def client(url, key=KEY):
    return openai.OpenAI(base_url=url + "/v1", api_key=key, max_retries=0)


def test_completions_are_the_engines_greedy_tokens_and_seeded_samples_repeat(server, tiny_model_dir):
    from alignment.envs.chat import prompt_text
    from alignment.models import GenerationConfig, LlamaForCausalLM, Tokenizer, generate

    messages = [{"role": "user", "content": "What is two plus two?"}]
    greedy = client(server).chat.completions.create(model="tiny", messages=messages, temperature=0, max_tokens=12)
    tokenizer = Tokenizer.from_pretrained(tiny_model_dir)
    model = LlamaForCausalLM.from_pretrained(tiny_model_dir)
    model.eval()
    import paddle

    ids = tokenizer.encode(prompt_text(tokenizer, messages), add_special_tokens=True)
    out = generate(model, paddle.to_tensor([ids]), paddle.ones([1, len(ids)], "int64"),
                   GenerationConfig(max_new_tokens=12, do_sample=False, eos_token_id=tokenizer.eos_token_id,
                                    pad_token_id=tokenizer.pad_token_id))
    n = int(out.response_mask.sum())
    text = tokenizer.decode(out.sequences.numpy()[0, len(ids): len(ids) + n].tolist(), skip_special_tokens=False)
    eos = tokenizer.decode([tokenizer.eos_token_id], skip_special_tokens=False)
    assert greedy.choices[0].message.content == text.removesuffix(eos)
    assert greedy.usage.prompt_tokens == len(ids) and greedy.usage.completion_tokens == n
    assert greedy.model == "tiny" and greedy.choices[0].finish_reason in ("stop", "length")
    seeded = [client(server).chat.completions.create(model="tiny", messages=messages, n=3, seed=7, logprobs=True)
              for _ in range(2)]
    texts = [[c.message.content for c in s.choices] for s in seeded]
    assert texts[0] == texts[1] and len(set(texts[0])) > 1  # the same seed again; each choice its own numbers
    per_choice = [[t.logprob for t in c.logprobs.content] for c in seeded[0].choices]
    assert sum(map(len, per_choice)) == seeded[0].usage.completion_tokens  # one log-prob per sampled token
    assert all(lp <= 0 for lps in per_choice for lp in lps)


def test_the_model_list_and_openai_shaped_errors(server):
    assert [m.id for m in client(server).models.list().data] == ["tiny"]
    with pytest.raises(openai.AuthenticationError, match="missing or wrong API key"):
        client(server, "wrong").models.list()
    with pytest.raises(openai.BadRequestError, match="'messages' must be a non-empty list"):
        client(server).chat.completions.create(model="tiny", messages=[])
    with pytest.raises(openai.BadRequestError, match=r"'temperature' must be in \[0, 2\]"):
        client(server).chat.completions.create(model="tiny", messages=[{"role": "user", "content": "x"}],
                                               temperature=5)
    headers = {"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"}
    cases = [(b"{not json", 400, "not valid JSON"), (b"[1, 2]", 400, "expected a JSON object"),
             (json.dumps({"messages": [{"role": "robot", "content": "x"}]}).encode(), 400, "role"),
             (b'{"messages": "' + b"x" * (5 << 20) + b'"}', 413, "limit")]
    for body, status, words in cases:
        answer = httpx.post(server + "/v1/chat/completions", content=body, headers=headers, timeout=60)
        error = answer.json()["error"]
        assert answer.status_code == status and words in error["message"] and error["type"], answer.text
    missing = httpx.get(server + "/v1/nothing", headers=headers)
    assert missing.status_code == 404 and missing.json()["error"]["type"] == "not_found_error"


def test_requests_are_checked_naming_the_parameter():
    good = {"messages": [{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}],
            "max_completion_tokens": 5, "stop": "END", "n": 2}
    request = parse_chat_request(good)
    assert request.messages[0].content == "ab" and request.max_tokens == 5 and request.stop == ("END",)
    for body, param in [({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, "messages[0].content"),
                        ({**good, "n": 99}, "n"), ({**good, "top_p": float("nan")}, "top_p"),
                        ({**good, "max_tokens": 2.5, "max_completion_tokens": None}, "max_tokens"),
                        ({**good, "stream": "yes"}, "stream"), ({**good, "tools": [{"type": "web"}]}, "tools")]:
        with pytest.raises(GatewayError) as caught:
            parse_chat_request(body)
        assert caught.value.status == 400 and caught.value.param == param
    with pytest.raises(GatewayError) as caught:
        parse_chat_request({"messages": [{"role": "user", "content": "x"}] * 3}, Limits(max_messages=2))
    assert caught.value.status == 413


def test_tool_calls_are_parsed_shown_and_written_back_as_the_format_writes_them():
    text = 'Let me compute.\n<tool_call>\n{"name": "calculator", "arguments": {"expression": "1+2"}}\n</tool_call>'
    message = render.reply(text, HERMES)
    assert message.content == "Let me compute." and [(c.name, c.arguments) for c in message.tool_calls] == [
        ("calculator", {"expression": "1+2"})]
    body = render.message_json(message)
    assert body["tool_calls"][0]["function"] == {"name": "calculator", "arguments": '{"expression": "1+2"}'}
    echoed = parse_chat_request({"messages": [{"role": "user", "content": "q"}, body,
                                              {"role": "tool", "tool_call_id": "call_0", "content": "3"}],
                                 "tools": [{"type": "function", "function": {"name": "calculator"}}]})
    shown = render.shown(echoed.messages, echoed.tools, HERMES)
    assert shown[0]["role"] == "system" and "<tools>" in shown[0]["content"] and "calculator" in shown[0]["content"]
    assert shown[2] == {"role": "assistant", "content": 'Let me compute.\n' + HERMES.format_call(
        "calculator", {"expression": "1+2"})} and shown[3] == {"role": "tool", "content": "3"}
    assert render.reply("no call here END more", HERMES, ("END",)).content == "no call here "


def test_a_session_continues_its_trajectory_on_the_same_cache_and_counts_an_edit(tiny_model_dir):
    from alignment.gateway.app import GatewayServer, create_app
    from alignment.gateway.serving import build_gateway
    from alignment.models import LlamaForCausalLM, Tokenizer

    model, tokenizer = LlamaForCausalLM.from_pretrained(tiny_model_dir), Tokenizer.from_pretrained(tiny_model_dir)
    model.eval()
    gateway = build_gateway(model, tokenizer, 2, 256, 8)
    session = gateway.open_session("s", np.random.default_rng(1))
    server = GatewayServer(create_app(gateway, KEY))
    done, replies = threading.Event(), []

    def agent():
        c = openai.OpenAI(base_url=f"{server.base_url}/sessions/s/v1", api_key=KEY, max_retries=0)
        try:
            messages = [{"role": "user", "content": "Count with me."}]
            for hint in ("go on", "and on"):
                reply = c.chat.completions.create(model="p", messages=messages).choices[0].message
                replies.append(reply.content)
                messages += [{"role": "assistant", "content": reply.content}, {"role": "user", "content": hint}]
            c.chat.completions.create(model="p", messages=messages[:1] + [{"role": "user", "content": "edited"}])
        finally:
            done.set()

    threading.Thread(target=agent, daemon=True).start()
    gateway.pump(done.is_set)
    server.stop()
    assert len(session.calls) == 3 and session.prefix_breaks == 1 and len(session.samples) == 2
    first = session.samples[0]
    assert first.num_turns == 2 and sum(first.action_mask) == sum(len(c["sampled"]) for c in session.calls[:2])
    # one trajectory: the prompt, the ids as sampled, then only the template text of the new message, sampled ids
    first_call, second = session.calls[:2]
    assert first.input_ids == first_call["fed"] + first_call["sampled"] + second["fed"] + second["sampled"]
    fed_text = tokenizer.decode(second["fed"], skip_special_tokens=False)
    assert "go on" in fed_text and "Count with me" not in fed_text
    assert [m == 1 for m in first.action_mask] == [False] * len(first_call["fed"]) + [True] * len(
        first_call["sampled"]) + [False] * len(second["fed"]) + [True] * len(second["sampled"])
    assert session.samples[1].num_turns == 1 and "edited" in tokenizer.decode(session.samples[1].input_ids)


def test_a_turn_the_budget_cuts_ends_the_episode_and_the_next_call_is_refused(tiny_model_dir):
    """As an environment's episode ends at max_trajectory_tokens: no new sample, no prefix break, the agent is told
    `context_length_exceeded` (the calculator agent ends its episode on it)."""
    from alignment.gateway.app import GatewayServer, create_app
    from alignment.gateway.serving import build_gateway
    from alignment.models import LlamaForCausalLM, Tokenizer

    model, tokenizer = LlamaForCausalLM.from_pretrained(tiny_model_dir), Tokenizer.from_pretrained(tiny_model_dir)
    model.eval()
    gateway = build_gateway(model, tokenizer, 2, 256, 8)
    session = gateway.open_session("s", np.random.default_rng(1), budget=3)
    server = GatewayServer(create_app(gateway, KEY))
    done, seen = threading.Event(), {}

    def agent():
        c = openai.OpenAI(base_url=f"{server.base_url}/sessions/s/v1", api_key=KEY, max_retries=0)
        try:
            messages = [{"role": "user", "content": "Count with me."}]
            choice = c.chat.completions.create(model="p", messages=messages, max_tokens=8).choices[0]
            seen["finish"] = choice.finish_reason
            messages += [{"role": "assistant", "content": choice.message.content}, {"role": "user", "content": "on"}]
            for attempt in (messages, messages[:1] + [{"role": "user", "content": "edited"}]):
                try:
                    c.chat.completions.create(model="p", messages=attempt)
                except openai.BadRequestError as err:
                    seen.setdefault("codes", []).append((err.status_code, err.code))
        finally:
            done.set()

    threading.Thread(target=agent, daemon=True).start()
    gateway.pump(done.is_set)
    server.stop()
    assert seen["finish"] == "length" and session.sample.truncated
    assert seen["codes"] == [(400, "context_length_exceeded")] * 2  # extended or edited: the episode is over
    assert len(session.samples) == 1 and session.prefix_breaks == 0 and len(session.calls) == 1
    assert len(session.calls[0]["sampled"]) == 3


def test_legacy_completions_score_token_ids_as_vllm_does(server, tiny_model_dir):
    """echo + logprobs over token-id prompts (what a served distillation teacher is asked): each token's log-prob
    is the model's, the top-k map holds the k best and the token itself, named token_id:<id>."""
    import paddle
    import paddle.nn.functional as F

    from alignment.models import LlamaForCausalLM

    prompts = [[5, 6, 7, 8, 9], [10, 11, 12]]
    body = {"model": "tiny", "prompt": prompts, "echo": True, "max_tokens": 1, "logprobs": 3,
            "return_tokens_as_token_ids": True, "temperature": 1.0}
    answer = httpx.post(server + "/v1/completions", json=body, headers={"Authorization": f"Bearer {KEY}"},
                        timeout=120)
    assert answer.status_code == 200, answer.text
    choices = sorted(answer.json()["choices"], key=lambda c: c["index"])
    model = LlamaForCausalLM.from_pretrained(tiny_model_dir)
    model.eval()
    for ids, choice in zip(prompts, choices):
        reference = F.log_softmax(model(paddle.to_tensor([ids])).logits[0], axis=-1).numpy()  # [L, vocab]
        logprobs = choice["logprobs"]
        assert logprobs["tokens"][: len(ids)] == [f"token_id:{t}" for t in ids] and len(logprobs["tokens"]) == \
            len(ids) + 1  # the echoed prompt, then the one new token
        assert logprobs["token_logprobs"][0] is None
        np.testing.assert_allclose(logprobs["token_logprobs"][1: len(ids)],
                                   [reference[i, t] for i, t in enumerate(ids[1:])], atol=2e-5)
        for position in range(1, len(ids)):
            top = logprobs["top_logprobs"][position]
            best = np.argsort(-reference[position - 1])[:3]
            assert {f"token_id:{t}" for t in best} | {f"token_id:{ids[position]}"} == set(top)
    refused = httpx.post(server + "/v1/completions", json={"prompt": [[5, 10 ** 9]], "max_tokens": 1},
                         headers={"Authorization": f"Bearer {KEY}"})
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "prompt"
