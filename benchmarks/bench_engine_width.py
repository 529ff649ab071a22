"""The decode engine's cache widths: a cache that grows rung by rung with its longest sequence (the default) against
one kept at its capacity's width, new tokens per second measured in the same run.

    python benchmarks/bench_engine_width.py [--model DIR] [--cases 16:32:64:96,...] [--repeats 3]

Each case is slots:prompt:new:capacity: that many random prompts of that length decoded greedily for exactly `new`
tokens (no eos) by one DecodeEngine of that capacity, as generate() and a gateway run it, with the width ladder
(alignment/models/slot_cache.py) and with `fixed_width=True`, alternating, --repeats times after a warm-up; medians
give tokens/s and their ratio. Also printed: the width the ladder ended at, and whether both gave the same tokens
and log-probs (they must: a row's bits are the same at every rung). The default model is a random-init LLaMA of
TRL's small test shape (benchmarks/peer_shape.py); --model takes a checkpoint directory. The default cases: TRL's
small shape (capacity below the ladder's floor: one width either way), long responses at 16 and 64 slots, and a
gateway's large capacity serving short turns. A third and fourth arm set the engine through the model's layers
(fused=False) against a lockstep batch through the same layers whose cache grows by concatenation each step (as
transformers' generate does): what the engine's fixed rows and its cache cost against no engine at all. Writes engine_width_<timestamp>.json (benchmarks/record.py:
--results-dir, --record, --no-save).
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

if not __package__:  # run as a script from a checkout: make `alignment` importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from alignment.cpu_env import apply_cpu_defaults, describe_machine, machine_facts  # noqa: E402

apply_cpu_defaults()  # this CPU's thread and MKL settings, before paddle is imported

DEFAULT_CASES = "16:32:64:96,16:64:448:512,64:64:448:512,8:50:100:2048"


def decode(model, prompts, new: int, capacity: int, fixed_width: bool, fused: bool = True):
    """Greedy `new` tokens of each prompt in one engine; -> (turns and log-probs, seconds, final width)."""
    from alignment.models import GenerationConfig
    from alignment.models.engine import DecodeEngine, DecodeSequence

    config = GenerationConfig(max_new_tokens=new, do_sample=False, eos_token_id=None, pad_token_id=0)
    engine = DecodeEngine(model, len(prompts), capacity, fused=fused, prefill_together=True, fixed_width=fixed_width)
    seqs = [DecodeSequence(p, config, capacity) for p in prompts]
    start = time.perf_counter()
    for seq in seqs:
        engine.add(seq)
    while engine.busy():
        engine.step()
    seconds = time.perf_counter() - start
    return [(s.turn, s.turn_log_probs) for s in seqs], seconds, engine.cache.width


def grown_by_concatenation(model, prompts, new: int):
    """The reference without the engine: one lockstep batch through the model's layers, its cache grown by
    concatenation each step (as transformers' generate does), greedy; -> (tokens per row, seconds)."""
    import paddle

    ids = paddle.to_tensor(prompts, dtype="int64")  # [b, prompt]: equal lengths, no padding
    b, width = ids.shape
    start = time.perf_counter()
    out = model(ids, attention_mask=paddle.ones([b, width], "int64"), use_cache=True, last_only=True)
    token, tokens = out.logits[:, -1].argmax(-1), []
    for i in range(new):
        tokens.append(token)
        if i == new - 1:
            break
        out = model(token.unsqueeze(-1), attention_mask=paddle.ones([b, width + i + 1], "int64"),
                    position_ids=paddle.full([b, 1], width + i, "int64"), past_key_values=out.past_key_values,
                    use_cache=True, last_only=True)
        token = out.logits[:, -1].argmax(-1)
    seconds = time.perf_counter() - start
    return paddle.stack(tokens, axis=1).numpy().tolist(), seconds


def measure(model, case: str, vocab: int, repeats: int) -> dict:
    import numpy as np

    slots, prompt, new, capacity = (int(x) for x in case.split(":"))
    if prompt + new > capacity:
        raise SystemExit(f"--cases {case}: prompt + new tokens exceed the capacity")
    rng = np.random.default_rng(0)
    prompts = [rng.integers(3, vocab, prompt).tolist() for _ in range(slots)]
    decode(model, prompts[:1], 2, capacity, False)  # warm-up: allocations, the fused weights' layout
    times = {"ladder": [], "fixed": [], "layers": [], "concatenated": []}
    outputs = {}
    for _ in range(repeats):
        for arm in times:
            if arm == "concatenated":
                outputs[arm], seconds = grown_by_concatenation(model, prompts, new)
            else:
                outputs[arm], seconds, width = decode(model, prompts, new, capacity, arm == "fixed", arm != "layers")
                if arm == "ladder":
                    ladder_width = width
            times[arm].append(seconds)
    rate = {arm: slots * new / statistics.median(seconds) for arm, seconds in times.items()}
    return {"slots": slots, "prompt": prompt, "new_tokens": new, "capacity": capacity, "ladder_width": ladder_width,
            "ladder_tokens_per_s": rate["ladder"], "fixed_tokens_per_s": rate["fixed"],
            "speedup": rate["ladder"] / rate["fixed"], "same_bits": outputs["ladder"] == outputs["fixed"],
            "engine_layers_tokens_per_s": rate["layers"], "concatenated_tokens_per_s": rate["concatenated"],
            "engine_over_concatenated": rate["layers"] / rate["concatenated"],
            "same_tokens_as_concatenated": [turn for turn, _ in outputs["layers"]] == outputs["concatenated"]}


def main(argv=None) -> list:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=None, help="a checkpoint directory (default: TRL's small shape, random init)")
    p.add_argument("--cases", default=DEFAULT_CASES, help="slots:prompt:new:capacity,...")
    p.add_argument("--repeats", type=int, default=3)
    from benchmarks import record

    record.add_arguments(p)
    args = p.parse_args(argv)
    import paddle

    from alignment.models import LlamaConfig, LlamaForCausalLM

    paddle.set_grad_enabled(False)
    if args.model:
        model, name = LlamaForCausalLM.from_pretrained(args.model), os.path.basename(os.path.normpath(args.model))
    else:
        from benchmarks.peer_shape import MODEL_SHAPE, VOCAB_SIZE

        paddle.seed(0)
        model, name = LlamaForCausalLM(LlamaConfig(vocab_size=VOCAB_SIZE, **MODEL_SHAPE)), "TRL small shape"
    model.eval()
    rows = []
    for case in args.cases.split(","):
        rows.append(measure(model, case, model.config.vocab_size, args.repeats))
        print(f"{case}: {rows[-1]['speedup']:.2f}x", flush=True)
    lines = ["| slots | prompt | new tokens | capacity | ladder's last width | ladder tokens/s | fixed width tokens/s "
             "| speed-up | same bits | engine (layers) / cache grown by concatenation | same tokens |",
             "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- | ---: | --- |"]
    lines += [f"| {r['slots']} | {r['prompt']} | {r['new_tokens']} | {r['capacity']} | {r['ladder_width']} | "
              f"{r['ladder_tokens_per_s']:.0f} | {r['fixed_tokens_per_s']:.0f} | {r['speedup']:.2f}x | "
              f"{r['same_bits']} | {r['engine_over_concatenated']:.2f}x | {r['same_tokens_as_concatenated']} |"
              for r in rows]
    print("\n".join(lines) + f"\n\n({name}, greedy, {describe_machine(machine_facts())})")
    record.save("engine_width", {"model": name, "repeats": args.repeats, "rows": rows}, record.results_dir(args),
                machine_facts())
    return rows


if __name__ == "__main__":
    main()
