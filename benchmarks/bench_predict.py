"""Inference speed: tools/predict.py's exported KV-cache program vs the dynamic model's generate, same prompts.

    python benchmarks/bench_predict.py [--model checkpoints/smollm2-135m-instruct] [--prompts 32]
        [--batch-size 8] [--max-new-tokens 32] [--repeats 3] [--threads N] [--no-save]

Exports --model (default: the tiny model of tools/make_tiny.py, built in a temp dir) with tools/export_model.py,
then decodes the same --prompts chat prompts of different lengths (left-padded batches of --batch-size, greedy,
stopping at eos) through the exported program with paddle.inference (tools/predict.py's path) and with
`generate(model, ..., use_cache=True)` on the dynamic model. Both run under the thread settings the predictor
sets for the whole process (MKL and OpenMP: --threads, default 1; predict.py keeps the process's own unless told). After a
warm-up batch each, the two take turns decoding the whole set, --repeats times. Prints the CPU, the load average,
the best new tokens/s of each, the median of the per-repeat speed ratios and whether the tokens are the same;
writes predict_<timestamp>.json (benchmarks/record.py: --results-dir, --record, --no-save).
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from alignment.cpu_env import apply_cpu_defaults  # noqa: E402

apply_cpu_defaults()  # this CPU's thread and MKL settings, before paddle is imported

SUBJECTS = ["the sea", "a lost key", "rainy mornings", "learning to cook", "an old friend", "the moon",
            "a busy market", "winter light"]
TEMPLATES = ["Say hi about {}.", "Write one cheerful sentence about {}.",
             "Describe {} in a short paragraph for a child who has never seen it, using simple words.",
             "Question: what would you tell a friend about {}, and why does it matter to you? Answer briefly."]


def make_prompts(n: int) -> list:
    """n prompts of four length classes (the batches get left padding)."""
    return [TEMPLATES[i % len(TEMPLATES)].format(SUBJECTS[i // len(TEMPLATES) % len(SUBJECTS)]) for i in range(n)]


def decode_all(lm, rows, config, batch_size: int):
    """(seconds, new token ids per prompt) for decoding all rows with lm, batch_size at a time."""
    from alignment.inference.batch_generation import generate_rows

    start = time.perf_counter()
    out = [ids for first in range(0, len(rows), batch_size)
           for ids in generate_rows(lm, rows[first: first + batch_size], config)]
    return time.perf_counter() - start, out


def timed(paths: dict, rows, config, batch_size: int, repeats: int) -> dict:
    """{name: [(seconds, new token ids per prompt) per repeat]}: a warm-up batch per path, then the paths take
    turns, repeat by repeat, so the load of a shared machine changes both alike."""
    from alignment.inference.batch_generation import generate_rows

    for lm in paths.values():
        generate_rows(lm, rows[:batch_size], config)
    runs = {name: [] for name in paths}
    for _ in range(repeats):
        for name, lm in paths.items():
            runs[name].append(decode_all(lm, rows, config, batch_size))
    return runs


def run(model_dir: str, args) -> dict:
    """Export model_dir, decode the prompts both ways; the figures as a dict."""
    from alignment.cpu_env import describe
    from alignment.models import GenerationConfig, LlamaForCausalLM, Tokenizer
    from alignment.inference import batch_generation, export, exported_model

    with tempfile.TemporaryDirectory() as tmp:
        start = time.perf_counter()
        exported = export.export(model_dir, os.path.join(tmp, "export"), quiet=True)
        export_s = time.perf_counter() - start
        info = exported_model.read_info(exported_model.find_export(exported))
        tokenizer = Tokenizer.from_pretrained(exported_model.find_export(exported))
        records = [{"prompt": p} for p in make_prompts(args.prompts)]
        rows = batch_generation.encode(tokenizer, records, False, args.max_new_tokens, info["max_position_embeddings"])
        config = GenerationConfig(max_new_tokens=args.max_new_tokens, do_sample=False,
                                  eos_token_id=info["eos_token_ids"] or None, pad_token_id=info["pad_token_id"])
        lm = exported_model.load(exported, "cpu", args.threads)  # sets MKL's and OpenMP's threads for both paths
        model = LlamaForCausalLM.from_pretrained(model_dir)
        model.eval()
        runs = timed({"exported": lm, "dynamic": model}, rows, config, args.batch_size, args.repeats)
    ids = {name: r[-1][1] for name, r in runs.items()}
    tokens = sum(len(row) for row in ids["exported"])
    ratios = sorted(d[0] / e[0] for e, d in zip(runs["exported"], runs["dynamic"]))  # same tokens: time ratio
    return {"cpu": describe(), "model": model_dir, "threads": lm.threads, "prompts": len(rows),
            "batch": args.batch_size, "prompt_tokens": f"{min(map(len, rows))}-{max(map(len, rows))}",
            "new_tokens": tokens, "export_s": export_s, "repeats": args.repeats,
            "exported_tokens_per_s": tokens / min(t for t, _ in runs["exported"]),
            "dynamic_tokens_per_s": sum(len(row) for row in ids["dynamic"]) / min(t for t, _ in runs["dynamic"]),
            "ratio": ratios[len(ratios) // 2], "ratios": ratios, "same_tokens": ids["exported"] == ids["dynamic"],
            "load_average": os.getloadavg()[0]}


def report(r: dict) -> str:
    return (f"{r['cpu']}\nmodel {r['model']}: {r['prompts']} prompts ({r['prompt_tokens']} tokens), batch "
            f"{r['batch']}, greedy, {r['new_tokens']} new tokens; export {r['export_s']:.1f} s; "
            f"load average {r['load_average']:.1f}\n\n"
            f"| path | new tokens / s (best of {r['repeats']}) |\n| --- | ---: |\n"
            f"| exported program (paddle.inference, KV cache, {r['threads']} math threads) | "
            f"{r['exported_tokens_per_s']:.1f} |\n"
            f"| dynamic model, generate(use_cache=True) | {r['dynamic_tokens_per_s']:.1f} |\n\n"
            f"exported / dynamic speed: {r['ratio']:.2f}x (median of the repeats' ratios, "
            f"{', '.join(f'{x:.2f}' for x in r['ratios'])}); same tokens: {r['same_tokens']}\n")


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=None, help="HF-layout checkpoint (default: a fresh tiny model)")
    p.add_argument("--prompts", type=int, default=32)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--max-new-tokens", type=int, default=32)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", type=int, default=1, help="the predictor's CPU math threads (as predict.py's)")
    from benchmarks import record

    record.add_arguments(p)
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = args.model
        if model_dir is None:
            from alignment.commands import make_tiny

            model_dir = make_tiny.main(["--output", os.path.join(tmp, "tiny")])
        result = run(model_dir, args)
    if args.model is None:
        result["model"] = "tiny (tools/make_tiny.py)"
    text = report(result)
    print(text)
    if not args.no_save:
        record.save("predict", result, record.results_dir(args))
    return result


if __name__ == "__main__":
    main()
