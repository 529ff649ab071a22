"""Streamed calls go out as the engine decodes them, through the real clients (`openai` chat completions and
Responses, `anthropic` Messages) on the tiny model scripted to write a known text: the first delta arrives while
the engine still has the turn in flight, the deltas add up to the unstreamed reply and the recording is the same
bits, no delta holds a stop string (nor its beginning) or half a character, and a client that hangs up frees its
slot."""
import dataclasses
import threading

import anthropic
import openai
import pytest

from alignment.envs.formats import tool_call_format
from alignment.gateway.app import GatewayServer, create_app
from alignment.gateway.backend import Gateway
from alignment.gateway.streaming import INCOMPLETE, settled
from alignment.models.sequence import PAUSED
from tests.scripted_model import Scripted

KEY = "k"
ROUTES = ("chat", "responses", "messages")
TALE = "Once upon a time in Köln a café sold crème brûlée for 5 € with Grüße to all. "  # ü: 2 tokens, €: 3
ASK = [{"role": "user", "content": "Tell me a tale."}]


@pytest.fixture(scope="module")
def tiny(tiny_model_dir):
    from alignment.models import LlamaForCausalLM, Tokenizer

    model = LlamaForCausalLM.from_pretrained(tiny_model_dir)
    model.eval()
    return model, Tokenizer.from_pretrained(tiny_model_dir)


def scripted(tiny, text, eos=True):
    """A one-slot gateway whose model writes `text` greedily (then eos), and the Scripted model."""
    from alignment.models import GenerationConfig

    model, tokenizer = tiny
    config = GenerationConfig(max_new_tokens=400, do_sample=False, eos_token_id=tokenizer.eos_token_id,
                              pad_token_id=tokenizer.pad_token_id)
    script = tokenizer.encode(text, add_special_tokens=False) + ([tokenizer.eos_token_id] if eos else [])
    double = Scripted(model, script)
    sampler = (lambda request: (dataclasses.replace(config, max_new_tokens=request.max_tokens or 400), 1.0))
    return Gateway(double, tokenizer, 1, 700, tool_call_format("hermes"), sampler), double


class Gate:
    """The agent's first delta: it sets `got` and waits for `go` (the test looks at the engine in between)."""

    def __init__(self):
        self.got, self.go = threading.Event(), threading.Event()

    def __call__(self):
        if not self.got.is_set():
            self.got.set()
            assert self.go.wait(60)


def call(route, url, stream, gate=None, stop=()):
    """One call -> (its text deltas or None unstreamed, the reply's text, its log-probs or None)."""
    if route == "messages":
        client = anthropic.Anthropic(base_url=url.removesuffix("/v1"), api_key=KEY, max_retries=0)
        kwargs = dict(model="p", max_tokens=400, messages=ASK, stop_sequences=list(stop) or anthropic.omit)
        if not stream:
            return None, "".join(b.text for b in client.messages.create(**kwargs).content), None
        deltas = []
        with client.messages.stream(**kwargs) as events:
            for event in events:
                if event.type == "content_block_delta" and event.delta.type == "text_delta":
                    deltas.append(event.delta.text)
                    gate and gate()
            reply = events.get_final_message()
        return deltas, "".join(b.text for b in reply.content), None
    client = openai.OpenAI(base_url=url, api_key=KEY, max_retries=0)
    if route == "responses":
        kwargs = dict(model="p", input=ASK, include=["message.output_text.logprobs"])
        if not stream:
            reply = client.responses.create(**kwargs)
            return None, reply.output_text, [t.logprob for t in reply.output[0].content[0].logprobs]
        deltas, logprobs = [], []
        for event in client.responses.create(**kwargs, stream=True):
            if event.type == "response.output_text.delta":
                deltas.append(event.delta)
                logprobs += [t.logprob for t in event.logprobs]
                gate and event.delta and gate()
        return deltas, event.response.output_text, logprobs
    kwargs = dict(model="p", messages=ASK, logprobs=True, stop=list(stop) or openai.omit)
    if not stream:
        choice = client.chat.completions.create(**kwargs).choices[0]
        return None, choice.message.content, [t.logprob for t in choice.logprobs.content]
    deltas, logprobs, finishes = [], [], []
    for chunk in client.chat.completions.create(**kwargs, stream=True, stream_options={"include_usage": True}):
        if not chunk.choices:  # the usage, last
            usage = chunk.usage
            continue
        choice = chunk.choices[0]
        deltas.append(choice.delta.content or "")
        logprobs += [t.logprob for t in (choice.logprobs.content if choice.logprobs else [])]
        finishes.append(choice.finish_reason)
        gate and choice.delta.content and gate()
    assert finishes[-1] == "stop" and not any(finishes[:-1]) and chunk.usage is usage
    assert usage.completion_tokens == len(logprobs)  # every token's log-prob streamed
    return deltas, "".join(deltas), logprobs


def play(gateway, agent, gate=None, idle=False):
    """Serve the gateway and pump it while agent(base_url) runs in a thread (and, `idle`, until the engine has
    nothing to step) -> (its result, the engine's sequences (turn length, state) when the agent got its first
    delta)."""
    server = GatewayServer(create_app(gateway, KEY))
    out = {}

    def run():
        try:
            out["result"] = agent(server.base_url)
        except Exception as err:  # noqa: BLE001 - reported by the test
            out["result"] = err

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    in_flight = None
    if gate is not None:
        gateway.pump(lambda: gate.got.is_set() or not thread.is_alive())
        in_flight = [(len(s.turn), s.state) for s in gateway.engine.running if s is not None]
        gate.go.set()
    gateway.pump(lambda: not thread.is_alive() and not (idle and gateway.engine.busy()))
    server.stop()
    assert not isinstance(out["result"], Exception), out["result"]
    return out["result"], in_flight


def recorded(session):
    return [(c["fed"], c["sampled"], c["log_probs"], c["ending"]) for c in session.calls], \
        [(s.input_ids, s.action_mask, s.log_probs) for s in session.samples]


@pytest.mark.parametrize("route", ROUTES)
def test_a_streamed_turn_arrives_as_it_is_decoded_and_adds_up_to_the_unstreamed_turn(tiny, route):
    text = TALE * 2
    runs = {}
    for stream in (False, True):
        gateway, _ = scripted(tiny, text)
        session = gateway.open_session("s", None, 600)
        gate = Gate() if stream else None
        result, in_flight = play(gateway, lambda url: call(route, f"{url}/sessions/s/v1", stream, gate), gate)
        runs[stream] = result, in_flight, recorded(session)
    (_, whole, logprobs), _, bits = runs[False]
    (deltas, streamed_reply, streamed_logprobs), in_flight, streamed_bits = runs[True]
    sampled = len(bits[0][0][1])
    assert whole == text and sampled > 40
    # (a) the first delta came while the engine was still sampling the turn
    assert len(in_flight) == 1 and in_flight[0][1] != PAUSED and in_flight[0][0] < sampled, in_flight
    # (b) the deltas add up to the unstreamed reply, token for token the same recording and log-probs
    assert "".join(deltas) == streamed_reply == whole and len([d for d in deltas if d]) > 10
    assert streamed_bits == bits and streamed_logprobs == logprobs
    # (d) no delta holds half a character
    assert not any(INCOMPLETE in d for d in deltas)


@pytest.mark.parametrize("route", ["chat", "messages"])  # Responses has no stop sequences
def test_no_delta_holds_a_stop_string_or_its_beginning(tiny, route):
    text = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda ENough said, END of the tale"
    gateway, _ = scripted(tiny, text)
    (deltas, reply, _), _ = play(gateway, lambda url: call(route, f"{url}/v1", True, stop=["END"]))
    assert reply == "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda ENough said, "
    assert "".join(deltas) == reply and len([d for d in deltas if d]) > 5
    sent = ""
    for delta in deltas:  # "E" and "EN" were held back until the next token showed they do not begin "END"
        sent += delta
        assert not sent.endswith(("E", "EN")), deltas


def test_a_client_that_hangs_up_mid_stream_frees_its_slot(tiny):
    gateway, double = scripted(tiny, "la", eos=False)  # "lalala...": turns of max_tokens unless cancelled
    gateway.open_session("s", None, 600)

    def agent(url):
        client = openai.OpenAI(base_url=f"{url}/v1", api_key=KEY, max_retries=0)
        stream = client.chat.completions.create(model="p", messages=ASK, max_tokens=600, stream=True)
        for chunk in stream:
            if chunk.choices and chunk.choices[0].delta.content:
                break
        stream.close()  # the serving request's client hangs up after its first delta
        again = client.chat.completions.create(model="p", messages=ASK, max_tokens=5)  # the one slot serves it
        anthropic_client = anthropic.Anthropic(base_url=f"{url}/sessions/s", api_key=KEY, max_retries=0)
        with anthropic_client.messages.stream(model="p", max_tokens=600, messages=ASK) as events:
            next(e for e in events if e.type == "content_block_delta")  # an episode's agent hangs up mid-turn
        return again.choices[0].finish_reason

    finish, _ = play(gateway, agent, idle=True)
    assert finish == "length"
    assert double.calls < 600  # forwards: two cut turns and 5 tokens, not 600 + 5 + 600
    assert gateway.engine.running == [None] and not gateway.engine.busy() and not gateway.running
    session = gateway.sessions["s"]
    assert session.closed and session.sample.num_turns == 0  # the cut turn is not recorded


@pytest.mark.parametrize("text, stops, call_open, shown", [
    ("Grüße aus K\ufffd", (), None, "Grüße aus K"),  # half a character
    ("alpha E", ("END",), None, "alpha "),  # could begin the stop string
    ("alpha ENough", ("END",), None, "alpha ENough"),
    ("alpha END beta", ("END",), None, "alpha "),
    ("Let me see. <tool", (), "<tool_call>", "Let me see."),  # could open a call; whitespace a call strips
    ("Let me see.\n<tool_call>{", (), "<tool_call>", "Let me see."),
    ("\nHello", (), "<tool_call>", ""),  # a reply with a call would strip the leading whitespace
    ("Hello there ", (), None, "Hello there "),
])
def test_settled_text_is_what_no_later_token_changes(text, stops, call_open, shown):
    assert settled(text, stops, call_open) == shown
