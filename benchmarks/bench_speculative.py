"""Speculative decoding by prompt lookup on SmolLM2-135M: greedy new tokens per second with and without it.

    python benchmarks/bench_speculative.py [--model DIR] [--tasks repeat,tool,reasoning,dialogue] [--prompts 8]
        [--batches 1,8] [--new-tokens 96] [--lookup 10] [--repeats 3]

Four tasks, their prompts through the model's chat template: `repeat` (repeat a list given in the prompt),
`tool` (the tool demo's held-out questions with the calculator's system prompt, as the tools environment renders
it), `reasoning` (held-out chain-sum problems, whose answers restate the problem) and `dialogue` (the quickstart's
held-out prompts: little to copy). For each task and batch size, --prompts prompts are decoded greedily in
batches by the decode engine (up to --new-tokens tokens, eos ends a row, log-probs taken as rollouts take them),
plain and with GenerationConfig.prompt_lookup_num_tokens = --lookup, alternating, --repeats times each after a
warm-up; the median times give tokens/s and their ratio, measured in the same run. Also printed: draft tokens
accepted per verify step, the share of drafted tokens accepted, and whether both produced the same tokens (greedy
speculative decoding keeps plain decoding's tokens unless two logits tie to float rounding). The checkpoint
defaults to checkpoints/smollm2-135m-instruct, imported from the GGUF when missing (as bench_smollm2.py does).
Writes speculative_<timestamp>.json (benchmarks/record.py: --results-dir, --record, --no-save).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if not __package__:  # run as a script from a checkout: make `alignment` importable
    sys.path.insert(0, ROOT)

from alignment.cpu_env import apply_cpu_defaults, describe_machine, machine_facts  # noqa: E402

apply_cpu_defaults()  # this CPU's thread and MKL settings, before paddle is imported

DEFAULT_MODEL = os.path.join(ROOT, "checkpoints", "smollm2-135m-instruct")
WORDS = ["apple", "river", "copper", "violet", "engine", "harbor", "maple", "signal", "thunder", "lantern",
         "meadow", "quartz", "falcon", "saddle", "orbit", "pepper"]


def jsonl(path: str, count: int) -> list:
    with open(os.path.join(ROOT, path), encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()][:count]


def task_messages(task: str, count: int) -> list:
    """`count` first-turn conversations of `task`."""
    if task == "repeat":
        return [[{"role": "user", "content": "Repeat this list exactly, one item per line: " +
                  ", ".join(WORDS[(i + j * 5) % len(WORDS)] for j in range(12)) + "."}] for i in range(count)]
    if task == "tool":
        import alignment.envs.tool_env  # noqa: F401  (registers the tools environment)
        from alignment.envs.base import make_environment

        env = make_environment("tools", tools=["calculator"], format="hermes-compact")
        return [env.reset(row) for row in jsonl("data/tool_arithmetic/heldout.jsonl", count)]
    if task == "reasoning":
        return [[{"role": "user", "content": row["prompt"]}] for row in jsonl("data/chain_sum/chain_sum_eval.jsonl",
                                                                              count)]
    if task == "dialogue":
        return [[{"role": "user", "content": row["prompt"]}] for row in jsonl("data/prompts/eval.jsonl", count)]
    raise SystemExit(f"unknown task {task!r}: repeat, tool, reasoning or dialogue")


def decode(model, prompts: list, config) -> tuple:
    """Greedy turns of `prompts` (id lists) in one engine, as generate() runs them; -> (turns, seconds, stats)."""
    from alignment.models.engine import DecodeEngine, DecodeSequence

    engine = DecodeEngine(model, len(prompts), max(map(len, prompts)) + config.max_new_tokens,
                          prefill_together=True)
    seqs = [DecodeSequence(p, config, len(p) + config.max_new_tokens, log_prob_temperature=1.0) for p in prompts]
    start = time.perf_counter()
    for seq in seqs:
        engine.add(seq)
    while engine.busy():
        engine.step()
    return [s.turn for s in seqs], time.perf_counter() - start, dict(engine.speculator.stats)


def measure(model, batches: list, plain, lookup, repeats: int) -> dict:
    """Both configs over every batch, alternating, `repeats` times; medians of the summed times."""
    times = {"plain": [], "lookup": []}
    for _ in range(repeats):
        for name, config in (("plain", plain), ("lookup", lookup)):
            runs = [decode(model, batch, config) for batch in batches]
            times[name].append(sum(seconds for _, seconds, _ in runs))
            turns = [turn for t, _, _ in runs for turn in t]
            if name == "plain":
                reference = turns
            else:
                same = turns == reference
                stats = {key: sum(s[key] for _, _, s in runs) for key in runs[0][2]}
    tokens = sum(len(turn) for turn in reference)
    plain_s, lookup_s = statistics.median(times["plain"]), statistics.median(times["lookup"])
    return {"new_tokens": tokens, "plain_tokens_per_s": tokens / plain_s, "lookup_tokens_per_s": tokens / lookup_s,
            "speedup": plain_s / lookup_s, "verify_steps": stats["verified"],
            "accepted_per_verify": stats["accepted"] / max(1, stats["verified"]),
            "draft_acceptance": stats["accepted"] / max(1, stats["drafted"]), "same_tokens": same}


def main(argv=None) -> list:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=DEFAULT_MODEL)
    p.add_argument("--tasks", default="repeat,tool,reasoning,dialogue")
    p.add_argument("--prompts", type=int, default=8, help="prompts per task")
    p.add_argument("--batches", default="1,8", help="batch sizes (sequences decoded at once)")
    p.add_argument("--new-tokens", type=int, default=96)
    p.add_argument("--lookup", type=int, default=4, help="prompt_lookup_num_tokens")
    p.add_argument("--ngram-max", type=int, default=3, help="prompt_lookup_max")
    p.add_argument("--ngram-min", type=int, default=2, help="prompt_lookup_min")
    p.add_argument("--repeats", type=int, default=3)
    from benchmarks import record

    record.add_arguments(p)
    args = p.parse_args(argv)
    from benchmarks.bench_smollm2 import ensure_checkpoint

    ensure_checkpoint(args.model)
    import paddle

    from alignment.envs.chat import prompt_text
    from alignment.models import GenerationConfig, LlamaForCausalLM, Tokenizer

    paddle.set_grad_enabled(False)
    model, tokenizer = LlamaForCausalLM.from_pretrained(args.model), Tokenizer.from_pretrained(args.model)
    model.eval()
    eos = model.config.eos_token_ids or tokenizer.eos_token_id
    plain = GenerationConfig(max_new_tokens=args.new_tokens, do_sample=False, eos_token_id=eos,
                             pad_token_id=tokenizer.pad_token_id)
    lookup = dataclasses.replace(plain, prompt_lookup_num_tokens=args.lookup, prompt_lookup_max=args.ngram_max,
                                 prompt_lookup_min=args.ngram_min)
    tasks = args.tasks.split(",")
    prompts = {task: [tokenizer.encode(prompt_text(tokenizer, m), add_special_tokens=True)
                      for m in task_messages(task, args.prompts)] for task in tasks}
    first = prompts[tasks[0]][:1]
    decode(model, first, plain), decode(model, first, lookup)  # warm-up: allocations, the fused weights' layout
    rows = []
    for batch in [int(b) for b in args.batches.split(",")]:
        for task in tasks:
            chunks = [prompts[task][i:i + batch] for i in range(0, len(prompts[task]), batch)]
            rows.append({"task": task, "batch": batch, "prompts": len(prompts[task]),
                         **measure(model, chunks, plain, lookup, args.repeats)})
            print(f"{task} at batch {batch}: {rows[-1]['speedup']:.2f}x", flush=True)
    lines = ["| task | batch | new tokens | plain tokens/s | prompt lookup tokens/s | speed-up | accepted per verify "
             "step | drafted accepted | same tokens |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |"]
    lines += [f"| {r['task']} | {r['batch']} | {r['new_tokens']} | {r['plain_tokens_per_s']:.1f} | "
              f"{r['lookup_tokens_per_s']:.1f} | {r['speedup']:.2f}x | {r['accepted_per_verify']:.2f} | "
              f"{100 * r['draft_acceptance']:.0f}% | {r['same_tokens']} |" for r in rows]
    print("\n".join(lines) + f"\n\n(greedy, up to {args.new_tokens} new tokens, prompt_lookup_num_tokens "
          f"{args.lookup}, medians of {args.repeats}; {os.path.basename(os.path.normpath(args.model))}; "
          f"{describe_machine(machine_facts())})")
    if not args.no_save:
        settings = {"model": os.path.basename(os.path.normpath(args.model)), "new_tokens": args.new_tokens,
                    "lookup": args.lookup, "ngram_max": args.ngram_max,
                    "ngram_min": args.ngram_min, "repeats": args.repeats}
        record.save("speculative", {**settings, "rows": rows}, record.results_dir(args))
    return rows


if __name__ == "__main__":
    main()
