"""Several LoRA adapters served on one base (alignment/models/multi_lora.py, `alignment-serve --adapter`): each row
of a mixed batch, and each answer of a server whose requests of different adapters share decode steps, is the same
bits as the adapter's own LoRA model (lora.py's LoRALinear) serving it; the model list, the 404 of an unknown
model, and one error line for a bad --adapter. (A sequence's slot does not change its bits: the engine runs a
multiple of 8 rows above 8 slots, tests/models/test_slot_cache.py.)"""
import os
import subprocess
import sys
import threading
import time

import numpy as np
import openai
import paddle
import pytest

from alignment.commands import serve
from alignment.gateway.protocol import parse_chat_request
from alignment.gateway.serving import build_gateway
from alignment.models import LlamaForCausalLM, Tokenizer
from alignment.models.lora import apply_lora, load_adapter, save_adapter
from alignment.models.multi_lora import load_adapters, routed
from tests.bad_input_harness import case, run_case
from tests.helpers import REPO
from tests.config.test_bad_inputs_models import other_base_adapter

# name -> (rank, alpha, targets, rsLoRA): ranks, scalings and target sets that differ between the adapters
ADAPTERS = {"math": (4, 8.0, ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"], False),
            "chat": (8, 16.0, ["q_proj", "v_proj"], True),
            "code": (2, 4.0, ["up_proj", "down_proj"], False)}
SLOTS, CAPACITY, MAX_TOKENS = 12, 192, 16  # 12 slots: every request of bodies() at once
SERVER_SLOTS = 4
QUESTIONS = ["What is two plus two?", "Name a colour.", "Count to five.", "Say hello."]


def make_adapter(base_dir, path, seed, rank, alpha, targets, rslora):
    """An adapter with random A and B (B not zero: the adapter changes the answers), saved in PEFT's layout."""
    model = LlamaForCausalLM.from_pretrained(base_dir)
    apply_lora(model, rank, alpha, 0.0, targets, rslora=rslora)
    rng = np.random.default_rng(seed)
    for name, param in model.named_parameters():
        if ".lora_" in name:
            param.set_value(paddle.to_tensor(rng.normal(0, 0.05, param.shape).astype("float32")))
    save_adapter(model, path, base_dir, "CAUSAL_LM")
    return path


@pytest.fixture(scope="module")
def adapters(tiny_model_dir, tmp_path_factory):
    root = tmp_path_factory.mktemp("adapters")
    return {name: make_adapter(tiny_model_dir, str(root / name), seed, *spec)
            for seed, (name, spec) in enumerate(ADAPTERS.items())}


def lone_model(base_dir, adapter=None):
    """The base, or the base with one adapter as training and `merge_lora` see it (LoRALinear)."""
    model = LlamaForCausalLM.from_pretrained(base_dir)
    if adapter is not None:
        rank, alpha, targets, rslora = ADAPTERS[adapter[0]]
        apply_lora(model, rank, alpha, 0.0, targets, rslora=rslora)
        load_adapter(model, adapter[1])
    model.eval()
    return model


def served_model(base_dir, adapters):
    model = LlamaForCausalLM.from_pretrained(base_dir)
    model.eval()
    load_adapters(model, adapters)
    return model


def bodies():
    """(model, request body) pairs: greedy and seeded sampling (n=2) for the base and every adapter."""
    out = []
    for i, name in enumerate(["tiny", *ADAPTERS]):
        messages = [{"role": "user", "content": QUESTIONS[i]}]
        out.append((name, {"model": name, "messages": messages, "temperature": 0, "logprobs": True}))
        out.append((name, {"model": name, "messages": messages, "temperature": 1.0, "seed": 11 + i, "n": 2,
                           "logprobs": True}))
    return out


def answered(gateway, requests, seen=None):
    """Submit every request before pumping (they start in the same step and decode together); -> the outcomes.
    seen: per engine step, the adapters of the sequences that step works on."""
    futures = [gateway.submit(None, parse_chat_request(body)) for body in requests]

    def done():
        if seen is not None:
            seen.append({s.adapter for s in gateway.engine.running if s is not None and s.state != "paused"})
        return all(f.done() for f in futures)

    gateway.pump(done)
    return [f.result() for f in futures]


def as_tokens(outcome):
    return [(c.tokens, tuple(t["logprob"] for t in c.logprobs)) for c in outcome.choices]


def test_each_row_of_a_mixed_batch_is_its_adapters_bits(tiny_model_dir, adapters):
    model = served_model(tiny_model_dir, adapters)
    ids = paddle.to_tensor(np.random.default_rng(0).integers(3, 1000, [7, 9]))
    rows = [0, None, 1, 0, 2, 2, None]
    with routed(model, rows):
        mixed = model(ids).logits.numpy()
    assert np.array_equal(model(ids).logits.numpy(), lone_model(tiny_model_dir)(ids).logits.numpy())  # unrouted
    for index, name in [(None, None), *enumerate(ADAPTERS)]:
        alone = lone_model(tiny_model_dir, None if name is None else (name, adapters[name]))(ids).logits.numpy()
        picked = [r for r, a in enumerate(rows) if a == index]
        assert np.array_equal(mixed[picked], alone[picked]), name
    assert not np.array_equal(mixed[0], mixed[2])  # the adapters do change the logits


def test_mixed_decode_steps_answer_as_each_adapter_alone(tiny_model_dir, adapters, paddles_operations):
    tokenizer = Tokenizer.from_pretrained(tiny_model_dir)
    multi = build_gateway(served_model(tiny_model_dir, adapters), tokenizer, SLOTS, CAPACITY, MAX_TOKENS,
                          name="tiny")
    requests = bodies()
    seen = []
    together = answered(multi, [body for _, body in requests], seen)
    assert max(len(step - {None}) for step in seen) == 3  # the three adapters in one decode step, the base too
    assert any(None in step and len(step) == 4 for step in seen)
    for name in ["tiny", *ADAPTERS]:  # the single-adapter server given the same traffic: the same slots
        adapter = None if name == "tiny" else (name, adapters[name])
        lone = build_gateway(lone_model(tiny_model_dir, adapter), tokenizer, SLOTS, CAPACITY, MAX_TOKENS, name="x")
        alone = answered(lone, [body for _, body in requests])
        for (asked, _), outcome, want in zip(requests, together, alone):
            if asked == name:
                assert outcome.model == name and as_tokens(outcome) == as_tokens(want), name
    assert len({as_tokens(o)[0][0] for o in together[::2]}) == 4  # greedy answers differ between the models


def test_legacy_completions_score_and_sample_with_the_adapter_asked_for(tiny_model_dir, adapters):
    from alignment.gateway.completions import parse_completion_request
    from alignment.gateway.protocol import Limits

    tokenizer = Tokenizer.from_pretrained(tiny_model_dir)

    def completion(model, name):
        gateway = build_gateway(model, tokenizer, SERVER_SLOTS, CAPACITY, MAX_TOKENS, name="tiny")
        body = {"model": name, "prompt": [[5, 17, 42, 9, 300]], "echo": True, "logprobs": 2, "max_tokens": 4,
                "temperature": 0}
        future = gateway.submit_completion(parse_completion_request(body, Limits(), 1024))
        gateway.pump(future.done)
        answer = future.result()
        return answer["model"], answer["choices"][0]["logprobs"]

    multi = served_model(tiny_model_dir, adapters)
    for name in ADAPTERS:
        got = completion(multi, name)
        assert got == (name, completion(lone_model(tiny_model_dir, (name, adapters[name])), "tiny")[1]), name
    assert got[1] != completion(multi, "tiny")[1]  # the prompt's log-probs are the adapter's, not the base's


@pytest.fixture(scope="module")
def server(tiny_model_dir, adapters, tmp_path_factory):
    port_file = tmp_path_factory.mktemp("serve") / "port"
    flags = [f for name, path in adapters.items() for f in ("--adapter", f"{name}={path}")]
    proc = subprocess.Popen([sys.executable, os.path.join(REPO, "tools", "serve.py"), "--model", tiny_model_dir,
                             "--name", "tiny", *flags, "--port", "0", "--port-file", str(port_file),
                             "--max-sequences", str(SERVER_SLOTS), "--max-length", str(CAPACITY),
                             "--max-tokens", str(MAX_TOKENS)], cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "ALIGNMENT_CPU_KERNELS": "off"})  # as paddles_operations
    deadline = time.time() + 120
    while not port_file.exists() and proc.poll() is None and time.time() < deadline:
        time.sleep(0.1)
    assert port_file.exists(), proc.stderr.read() if proc.poll() is not None else "no port file"
    yield openai.OpenAI(base_url=f"http://127.0.0.1:{port_file.read_text().strip()}/v1", api_key="none",
                        max_retries=0)
    proc.terminate()
    proc.wait(timeout=30)


def test_the_server_answers_threads_of_different_adapters_as_each_alone(server, tiny_model_dir, adapters,
                                                                       paddles_operations):
    assert [m.id for m in server.models.list().data] == ["tiny", *ADAPTERS]
    with pytest.raises(openai.NotFoundError) as caught:
        server.chat.completions.create(model="nope", messages=[{"role": "user", "content": "x"}])
    assert caught.value.body["code"] == "model_not_found" and "math" in caught.value.body["message"]
    requests, replies = bodies(), {}
    threads = [threading.Thread(target=lambda i=i, body=body: replies.__setitem__(
        i, server.chat.completions.create(**body))) for i, (_, body) in enumerate(requests)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=300)
    tokenizer = Tokenizer.from_pretrained(tiny_model_dir)
    for i, (name, body) in enumerate(requests):
        adapter = None if name == "tiny" else (name, adapters[name])
        lone = build_gateway(lone_model(tiny_model_dir, adapter), tokenizer, SERVER_SLOTS, CAPACITY, MAX_TOKENS,
                             name="x")
        alone = answered(lone, [body])[0]
        got = [(c.message.content, [t.logprob for t in c.logprobs.content]) for c in replies[i].choices]
        want = [(c.message.content, [t["logprob"] for t in c.logprobs]) for c in alone.choices]
        assert replies[i].model == name and got == want, name


def bad_serve(*argv):
    return lambda t, m: lambda: serve.main(["--model", m, *[a.format(t=t, m=m) for a in argv]])


def good_then(make_bad):
    """A valid adapter at {t}/good and a bad one built by make_bad(t, m) -> its directory."""
    def build(t, m):
        make_adapter(m, str(t / "good"), 0, *ADAPTERS["chat"])
        bad = make_bad(t, m)
        return lambda: serve.main(["--model", m, "--adapter", f"good={t}/good", "--adapter", f"bad={bad}"])
    return build


def modules_to_save_adapter(t, m):
    model = LlamaForCausalLM.from_pretrained(m)
    apply_lora(model, 4, 8.0, 0.0, ["q_proj"], trainable=("lm_head.",))
    save_adapter(model, str(t / "head"), m, "CAUSAL_LM")
    return str(t / "head")


BAD = [case("--adapter without =", bad_serve("--adapter", "{t}/x"), "--adapter", "NAME=DIRECTORY"),
       case("--adapter twice the same name", bad_serve("--adapter", "a={t}", "--adapter", "a={t}"), "--adapter",
            "'a' is given twice"),
       case("--adapter named as the base", bad_serve("--name", "tiny", "--adapter", "tiny={t}"), "'tiny'"),
       case("--adapter to a missing directory", bad_serve("--adapter", "a={t}/missing"), "--adapter a=",
            "missing: no such directory"),
       case("--adapter to a directory without adapter_config.json", bad_serve("--adapter", "a={t}"), "--adapter a=",
            "no adapter_config.json"),
       case("--adapter trained for another base", good_then(lambda t, m: other_base_adapter(t)),
            "--adapter bad=", "adapter", "another base model", "hidden_size 128"),
       case("--adapter with modules_to_save", good_then(modules_to_save_adapter), "--adapter bad=", "lm_head",
            "merge_lora")]


@pytest.mark.parametrize("bad", BAD, ids=[c.id for c in BAD])
def test_a_bad_adapter_is_one_error_line_naming_the_flag_and_directory(bad, tmp_path, tiny_model_dir, capsys):
    line = run_case(bad, tmp_path, tiny_model_dir, capsys)
    assert "--adapter" in line
