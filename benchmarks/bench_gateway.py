"""What the gateway adds to the decode engine: the per-call overhead of `alignment-serve`'s OpenAI-compatible
gateway, and the tokens/s of concurrent streamed sessions through it against the engine alone.

    python benchmarks/bench_gateway.py [--model DIR] [--sessions 16] [--single-calls 8] [--max-tokens 64]
        [--max-length 256] [--temperature 0] [--repeats 5] [--note TEXT] [--results-dir DIR | --record | --no-save]

The requests: --sessions first-turn chats of the quickstart's held-out prompts (data/prompts/eval.jsonl), each a
streamed chat-completion body (`stream: true`, usage included) with --max-tokens and --temperature (0: greedy)
and its index as seed. Two sides in one process, taking turns block by block (which goes first swaps every
repeat), after a warm-up of each:

- the engine alone: each request's prompt ids, rendered and tokenized as the gateway does, decoded by a
  DecodeEngine of the gateway's shape (--sessions slots of --max-length tokens) with the GenerationConfig and seed
  the gateway gives that request;
- the gateway: `alignment-serve`'s server (alignment/gateway/serving.py: uvicorn in a thread, the engine pumped in
  the main thread) answering the same bodies over HTTP on 127.0.0.1, sent by an asyncio + httpx client in a thread
  of the same process (so the client's own parsing counts as the gateway's).

Each side runs the first --single-calls requests one at a time (each call's latency) and all --sessions at once (new
tokens over the block's wall time). Reported: each side's median latency (over the calls and repeats) and tokens/s,
the per-call overhead (the gateway's latency minus the engine's for the same request in the same repeat, in ms and
as a share of the gateway's latency: the median over calls and repeats), the ratio of the concurrent sessions'
tokens/s (the median over repeats of the two blocks' ratio) and the time to the first content delta through the
gateway (the stream sends text as the engine decodes it: a single call's, and the sessions' median per block;
medians over calls and repeats): pairs of blocks that ran one after the other, which a
shared machine's load disturbs alike. The run stops with an error when a call through the gateway sampled other
tokens than the engine alone, or streamed other text or token counts than it sampled.
Default --model: the tiny model of tools/make_tiny.py, built in a temporary directory. Writes
gateway_<timestamp>.json where benchmarks/record.py's flags say (--record: benchmarks/results/).
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if not __package__:  # run as a script from a checkout: make `alignment` and `benchmarks` importable
    sys.path.insert(0, ROOT)

from alignment.cpu_env import apply_cpu_defaults, describe_machine, machine_facts  # noqa: E402

apply_cpu_defaults()  # this CPU's thread and MKL settings, before paddle is imported

KEY = "bench-key"
PROMPTS = os.path.join(ROOT, "data", "prompts", "eval.jsonl")


def chat_bodies(count: int, max_tokens: int, temperature: float) -> list:
    """`count` streamed chat-completion bodies, one per held-out prompt, seeded by their index."""
    with open(PROMPTS, encoding="utf-8") as f:
        prompts = [json.loads(line)["prompt"] for line in f if line.strip()]
    if count > len(prompts):
        raise SystemExit(f"--sessions {count}: {PROMPTS} holds {len(prompts)} prompts")
    return [{"model": "policy", "messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens,
             "temperature": temperature, "seed": index, "stream": True, "stream_options": {"include_usage": True}}
            for index, prompt in enumerate(prompts[:count])]


class EngineAlone:
    """The gateway's requests decoded by a DecodeEngine of the gateway's shape, with no gateway around it."""

    def __init__(self, gateway, bodies: list):
        from alignment.envs.chat import prompt_text
        from alignment.gateway import render
        from alignment.gateway.protocol import parse_chat_request
        from alignment.models.engine import DecodeEngine

        self.engine = DecodeEngine(gateway.engine.model, gateway.engine.slots, gateway.capacity)
        self.capacity, self.requests = gateway.capacity, [parse_chat_request(body) for body in bodies]
        self.prompts = [tuple(gateway.tokenizer.encode(prompt_text(gateway.tokenizer, render.shown(
            r.messages, r.tools, gateway.fmt)), add_special_tokens=True)) for r in self.requests]
        self.samplings = [gateway.sampler(r) for r in self.requests]  # (GenerationConfig, log-prob temperature)

    def decode(self, indices: list) -> tuple:
        """The requests `indices` added at once and stepped until every turn ended; -> (their sampled ids,
        seconds)."""
        import numpy as np

        from alignment.models.engine import DecodeSequence

        seeds = [self.requests[i].seed for i in indices]  # a seeded request's numbers, as the gateway draws them
        seqs = [DecodeSequence(self.prompts[i], self.samplings[i][0], self.capacity,
                         rng=None if seed is None else np.random.default_rng([seed, 0]),
                         log_prob_temperature=self.samplings[i][1]) for i, seed in zip(indices, seeds)]
        start = time.perf_counter()
        for seq in seqs:
            self.engine.add(seq)
        while self.engine.busy():
            self.engine.step()
        seconds = time.perf_counter() - start
        for seq in seqs:
            self.engine.release(seq)
        return [tuple(seq.turn) for seq in seqs], seconds


async def streamed_call(client, body: dict) -> dict:
    """One streamed chat completion: its latency (to `data: [DONE]`), its time to the first content delta, the
    content and the usage it streamed."""
    start, content, usage, first = time.perf_counter(), [], None, None
    async with client.stream("POST", "/v1/chat/completions", json=body) as response:
        if response.status_code != 200:
            raise RuntimeError(f"gateway answered {response.status_code}: {(await response.aread())[:500]!r}")
        async for line in response.aiter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                chunk = json.loads(line[len("data: "):])
                content += [choice["delta"].get("content") or "" for choice in chunk["choices"]]
                usage = chunk.get("usage") or usage
                if first is None and any(content):
                    first = time.perf_counter() - start
    return {"seconds": time.perf_counter() - start, "first_token_s": first, "content": "".join(content),
            "completion_tokens": usage["completion_tokens"]}


class ThroughGateway:
    """`alignment-serve`'s gateway on 127.0.0.1 and an asyncio + httpx client with a loop of its own thread; the
    caller's thread pumps the engine while a block of calls runs, as `serving.serve` does."""

    def __init__(self, gateway):
        import logging

        import httpx

        from alignment.gateway.app import GatewayServer, create_app

        self.gateway, self.server = gateway, GatewayServer(create_app(gateway, KEY))
        logging.getLogger("httpx").setLevel(logging.WARNING)  # a log line per request would be timed as the gateway's
        self.loop = asyncio.new_event_loop()
        threading.Thread(target=self.loop.run_forever, name="bench-client", daemon=True).start()

        async def open_client():
            return httpx.AsyncClient(base_url=self.server.base_url, timeout=None,
                                     headers={"Authorization": f"Bearer {KEY}"},
                                     limits=httpx.Limits(max_connections=None, max_keepalive_connections=None))

        self.client = asyncio.run_coroutine_threadsafe(open_client(), self.loop).result()
        self.sampled = {}  # prompt ids -> the gateway's Choice (its sampled ids, which no HTTP answer carries)
        outcome_of = gateway._outcome

        def recording(call):
            outcome = outcome_of(call)
            self.sampled[tuple(call.session.calls[0]["fed"])] = outcome.first
            return outcome

        gateway._outcome = recording

    def calls(self, bodies: list, concurrent: bool) -> tuple:
        """The bodies sent all at once or one after another; -> (each call's streamed answer, seconds)."""
        async def block():
            if concurrent:
                return await asyncio.gather(*(streamed_call(self.client, body) for body in bodies))
            return [await streamed_call(self.client, body) for body in bodies]

        self.sampled.clear()
        start = time.perf_counter()
        running = asyncio.run_coroutine_threadsafe(block(), self.loop)
        self.gateway.pump(running.done)
        answers = running.result()
        return answers, time.perf_counter() - start

    def close(self) -> None:
        asyncio.run_coroutine_threadsafe(self.client.aclose(), self.loop).result()
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.server.stop()


def check_gateway(alone: EngineAlone, indices: list, turns: list, answers: list, sampled: dict) -> None:
    """The gateway sampled `turns` (the engine alone's ids) for the requests `indices`, and streamed those turns'
    text and token counts."""
    for i, turn, answer in zip(indices, turns, answers):
        choice = sampled[alone.prompts[i]]
        if choice.tokens != turn:
            raise AssertionError(f"request {i}: the gateway sampled {list(choice.tokens)}, the engine alone "
                                 f"{list(turn)}")
        if (answer["content"], answer["completion_tokens"]) != (choice.message.content, len(turn)):
            raise AssertionError(f"request {i}: streamed {answer['content']!r} ({answer['completion_tokens']} "
                                 f"tokens), sampled {choice.message.content!r} ({len(turn)} tokens)")


def measure(alone: EngineAlone, gateway: ThroughGateway, bodies: list, single_calls: int, repeats: int) -> dict:
    """Both sides, block for block (each single call, then the concurrent sessions), the side going first swapped
    every repeat; -> the seconds of every block and the new tokens."""
    singles, everyone = list(range(single_calls)), list(range(len(bodies)))
    # the warm-up, and the turns every later block must sample again (greedy or seeded: the same bits every run)
    single_turns = [alone.decode([i])[0][0] for i in singles]
    concurrent_turns = alone.decode(everyone)[0]
    check_gateway(alone, [0], single_turns[:1], gateway.calls(bodies[:1], concurrent=False)[0], gateway.sampled)
    check_gateway(alone, everyone, concurrent_turns, gateway.calls(bodies, concurrent=True)[0], gateway.sampled)
    times = {"engine_single_s": [[] for _ in singles], "gateway_single_s": [[] for _ in singles],
             "engine_concurrent_s": [], "gateway_concurrent_s": [],
             "gateway_single_first_token_s": [[] for _ in singles], "gateway_concurrent_first_token_s": []}

    def block(side: str, indices: list, expected: list) -> float:
        if side == "engine":
            turns, seconds = alone.decode(indices)
            if turns != expected:
                raise AssertionError(f"the engine alone sampled other tokens for the requests {indices} than before")
            return seconds
        answers, seconds = gateway.calls([bodies[i] for i in indices], concurrent=len(indices) > 1)
        check_gateway(alone, indices, expected, answers, gateway.sampled)
        firsts = [a["first_token_s"] for a in answers if a["first_token_s"] is not None]
        if firsts:  # a call's time to its first content delta; the sessions': their median
            (times["gateway_single_first_token_s"][indices[0]] if len(indices) == 1 else
             times["gateway_concurrent_first_token_s"]).append(statistics.median(firsts))
        return answers[0]["seconds"] if len(indices) == 1 else seconds  # one call: its latency, as the client saw it

    for repeat in range(repeats):
        sides = ("engine", "gateway") if repeat % 2 == 0 else ("gateway", "engine")
        for i in singles:
            for side in sides:
                times[f"{side}_single_s"][i].append(block(side, [i], single_turns[i:i + 1]))
        for side in sides:
            times[f"{side}_concurrent_s"].append(block(side, everyone, concurrent_turns))
    return {**times, "single_new_tokens": [len(turn) for turn in single_turns],
            "concurrent_new_tokens": sum(len(turn) for turn in concurrent_turns)}


def summarize(times: dict, sessions: int) -> dict:
    """The figures: each side's latency (over the single calls and repeats) and tokens/s, medians; the overhead and
    the ratio from the pairs of blocks that ran one after the other (a call on both sides, the sessions on both
    sides), medians over the pairs, which a shared machine's load disturbs alike."""
    median = statistics.median
    pairs = [(g, e) for gateway, engine in zip(times["gateway_single_s"], times["engine_single_s"])
             for g, e in zip(gateway, engine)]
    tokens = times["concurrent_new_tokens"]
    engine_s, gateway_s = median(times["engine_concurrent_s"]), median(times["gateway_concurrent_s"])
    return {"single_call": {"calls": len(times["engine_single_s"]),
                            "new_tokens": statistics.mean(times["single_new_tokens"]),
                            "engine_ms": 1000 * median(e for _, e in pairs),
                            "gateway_ms": 1000 * median(g for g, _ in pairs),
                            "overhead_ms": 1000 * median(g - e for g, e in pairs),
                            "overhead_share": median((g - e) / g for g, e in pairs),
                            "first_token_ms": first_token_ms([t for ts in times["gateway_single_first_token_s"]
                                                              for t in ts])},
            "concurrent": {"sessions": sessions, "new_tokens": tokens,
                           "engine_tokens_per_s": tokens / engine_s, "gateway_tokens_per_s": tokens / gateway_s,
                           "gateway_over_engine": median(e / g for g, e in zip(times["gateway_concurrent_s"],
                                                                              times["engine_concurrent_s"])),
                           "first_token_ms": first_token_ms(times["gateway_concurrent_first_token_s"])}}


def first_token_ms(seconds: list):
    """The median time to the first content delta through the gateway, in ms (None: no call streamed content)."""
    return 1000 * statistics.median(seconds) if seconds else None


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", help="HF-layout checkpoint (default: the tiny model of tools/make_tiny.py, built in a "
                                   "temporary directory)")
    p.add_argument("--sessions", type=int, default=16, help="streamed sessions at once (the engine's slots)")
    p.add_argument("--single-calls", type=int, default=8, help="requests also timed one call at a time")
    p.add_argument("--max-tokens", type=int, default=64, help="each request's max_tokens")
    p.add_argument("--max-length", type=int, default=256,
                   help="tokens per sequence, prompt included (alignment-serve's --max-length)")
    p.add_argument("--temperature", type=float, default=0.0, help="0: greedy; above 0: sampled, each request seeded")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--note", default="", help="recorded with the figures (what else ran on the machine, say)")
    from benchmarks import record

    record.add_arguments(p)
    args = p.parse_args(argv)
    if not 1 <= args.single_calls <= args.sessions or args.repeats < 1 or args.max_tokens >= args.max_length:
        p.error("need 1 <= --single-calls <= --sessions, --repeats >= 1 and --max-tokens < --max-length")
    model_dir = args.model
    if model_dir is None:
        from alignment.commands import make_tiny

        model_dir = make_tiny.main(["--output", os.path.join(tempfile.mkdtemp(), "tiny")])
    from alignment.gateway.serving import build_gateway
    from alignment.models import LlamaForCausalLM, Tokenizer

    model, tokenizer = LlamaForCausalLM.from_pretrained(model_dir), Tokenizer.from_pretrained(model_dir)
    model.eval()
    gateway = build_gateway(model, tokenizer, args.sessions, args.max_length, args.max_tokens)
    bodies = chat_bodies(args.sessions, args.max_tokens, args.temperature)
    alone, served = EngineAlone(gateway, bodies), ThroughGateway(gateway)
    load_before = os.getloadavg()
    try:
        times = measure(alone, served, bodies, args.single_calls, args.repeats)
    finally:
        served.close()
    figures = {"model": os.path.basename(os.path.normpath(model_dir)) if args.model else "tiny (tools/make_tiny.py)",
               "sessions": args.sessions, "single_calls": args.single_calls, "max_tokens": args.max_tokens,
               "max_length": args.max_length, "temperature": args.temperature, "repeats": args.repeats,
               "prompt_tokens": statistics.mean(len(ids) for ids in alone.prompts), "same_tokens": True,
               **summarize(times, args.sessions), "load_average": [load_before, os.getloadavg()],
               "note": args.note, "times": times}
    single, many = figures["single_call"], figures["concurrent"]
    print(describe_machine(machine_facts()))
    print(f"one call ({single['new_tokens']:.1f} new tokens): engine alone {single['engine_ms']:.1f} ms, through "
          f"the gateway {single['gateway_ms']:.1f} ms: {single['overhead_ms']:.1f} ms overhead "
          f"({100 * single['overhead_share']:.1f}%; medians of the calls' differences); first content delta after "
          f"{single['first_token_ms'] or float('nan'):.1f} ms")
    print(f"{args.sessions} concurrent streamed sessions ({many['new_tokens']} new tokens): engine alone "
          f"{many['engine_tokens_per_s']:.1f} tokens/s, through the gateway {many['gateway_tokens_per_s']:.1f} "
          f"tokens/s: {many['gateway_over_engine']:.2f}x (medians of the repeats' ratios); the same tokens on both "
          f"sides; first content delta after {many['first_token_ms'] or float('nan'):.1f} ms (median)")
    if not args.no_save:
        record.save("gateway", figures, record.results_dir(args))
    return figures


if __name__ == "__main__":
    main()
