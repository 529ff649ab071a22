"""The evaluation harness's own speed: samples/s of a k=8 evaluation (alignment.evaluation: per-sample seeds,
the decode engine, reward functions, the records) against the single-turn generate path on the same prompts.

    python benchmarks/bench_eval.py [--model checkpoints/smollm2-135m-instruct] [--task chain_sum] [--items 16]
        [--n 8] [--batch-size 32] [--repeats 2] [--results-dir DIR | --record | --no-save]

Both paths sample --n responses to each of the task's first --items prompts at temperature 1.0 and at most the
task's max_new_tokens, --batch-size sequences at a time: the harness through `evaluate` (scoring included), the
generate path as `alignment.models.generate` on the same chat prompts repeated n times, left-padded (tokens only).
After a warm-up, the two take turns --repeats times; prints samples/s of each and their ratio, and writes
eval_harness_<timestamp>.json where benchmarks/record.py's flags say (--record: benchmarks/results/). Default --model: the tiny model of
tools/make_tiny.py, built in a temporary directory.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from alignment.cpu_env import apply_cpu_defaults, describe_machine, machine_facts  # noqa: E402

apply_cpu_defaults()  # this CPU's thread and MKL settings, before paddle is imported


def generate_path(policy, rows, n: int, batch_size: int, max_new_tokens: int) -> int:
    """Sample n responses per row with models.generate in left-padded batches; returns the new tokens."""
    import paddle

    from alignment.data.tokenized import collate_prompts
    from alignment.models import generate

    config = policy.generation_config(max_new_tokens, 1.0, 1.0)
    prompts = [{"input_ids": policy.prompt_ids(row)} for row in rows for _ in range(n)]
    tokens = 0
    for start in range(0, len(prompts), batch_size):
        batch = collate_prompts(prompts[start: start + batch_size], policy.tokenizer.pad_token_id)
        out = generate(policy.model, paddle.to_tensor(batch["input_ids"]), paddle.to_tensor(batch["attention_mask"]),
                       config)
        tokens += int(out.response_mask.sum())
    return tokens


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model")
    parser.add_argument("--task", default="chain_sum")
    parser.add_argument("--items", type=int, default=16)
    parser.add_argument("--n", type=int, default=8)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=2)
    from benchmarks import record

    record.add_arguments(parser)
    args = parser.parse_args(argv)
    from alignment.evaluation.policies import LocalPolicy
    from alignment.evaluation.runner import EvalSettings, evaluate
    from alignment.evaluation.tasks import make_task

    model = args.model
    if model is None:
        from alignment.commands import make_tiny

        model = make_tiny.main(["--output", os.path.join(tempfile.mkdtemp(), "tiny")])
    policy, task = LocalPolicy(model), make_task(args.task)
    rows = task.rows()[: args.items]
    settings = EvalSettings(n=args.n, batch_size=args.batch_size, limit=args.items)
    harness_s, generate_s, harness_tokens, generate_tokens = [], [], 0, 0
    evaluate(policy, task, EvalSettings(n=args.n, batch_size=args.batch_size, limit=1))  # warm-up
    for _ in range(args.repeats):
        start = time.perf_counter()
        result = evaluate(policy, task, settings)
        harness_s.append(time.perf_counter() - start)
        harness_tokens = sum(s["tokens"] for r in result["items"] for s in r["samples"])
        start = time.perf_counter()
        generate_tokens = generate_path(policy, rows, args.n, args.batch_size, task.max_new_tokens)
        generate_s.append(time.perf_counter() - start)
    samples = len(rows) * args.n
    figures = {"model": os.path.basename(os.path.normpath(model)), "task": args.task, "items": len(rows),
               "n": args.n, "batch_size": args.batch_size, "repeats": args.repeats,
               "harness_samples_per_s": samples / min(harness_s), "generate_samples_per_s": samples / min(generate_s),
               "harness_tokens": harness_tokens, "generate_tokens": generate_tokens,
               "harness_s": harness_s, "generate_s": generate_s}
    figures["harness_over_generate"] = figures["harness_samples_per_s"] / figures["generate_samples_per_s"]
    print(describe_machine(machine_facts()))
    print(f"{samples} samples: harness {figures['harness_samples_per_s']:.2f} samples/s "
          f"({harness_tokens} tokens), generate {figures['generate_samples_per_s']:.2f} samples/s "
          f"({generate_tokens} tokens): {figures['harness_over_generate']:.2f}x")
    if not args.no_save:
        record.save("eval_harness", figures, results_dir=record.results_dir(args))
    return figures


if __name__ == "__main__":
    main()
