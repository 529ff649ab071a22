"""One RL step (GRPO on SmolLM2-135M) with plain decoding, prompt lookup and a layer-dropped draft model.

    python benchmarks/bench_speculative_rl.py [--model DIR] [--tasks tool,reasoning,dialogue]
        [--modes plain,lookup,draft] [--prompts 2] [--group 4] [--new-tokens 48] [--lookup 4] [--keep-every 2]
        [--assistant-tokens 3] [--repeats 3]

Three tasks as GRPO runs them: `tool` (the tools environment with the calculator, multi-turn episodes on the tool
demo's held-out questions), `reasoning` (held-out chain-sum problems, single turn, accuracy reward) and `dialogue`
(the quickstart's held-out prompts, single turn, sentiment reward). Each mode is one run of alignment-ppo for one
step, in a process of its own (its first-call costs included, alike for every mode) (--prompts prompts, --group sampled answers each, temperature 1, seed 42): `plain`, `lookup`
(prompt_lookup_num_tokens = --lookup) and `draft` (speculative_draft_keep_every = --keep-every,
num_assistant_tokens = --assistant-tokens). The modes alternate, --repeats times per task; the step's own timers
(time/generate, time/score, time/train: the run's metrics.jsonl) give medians, the generate phase's tokens/s and
the whole step's seconds, and their ratios to plain decoding, measured in the same run. Sampled rollouts: the
speculative modes' tokens are distributed as plain decoding's, not the same tokens, so each mode's generated
tokens are printed beside its speed. The checkpoint defaults to checkpoints/smollm2-135m-instruct, imported from
the GGUF package when missing (bench_smollm2.py's ensure_checkpoint). Writes speculative_rl_<timestamp>.json
(benchmarks/record.py: --results-dir, --record, --no-save).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if not __package__:  # run as a script from a checkout: make `alignment` importable
    sys.path.insert(0, ROOT)

from alignment.cpu_env import apply_cpu_defaults, describe_machine, machine_facts  # noqa: E402

apply_cpu_defaults()  # this CPU's thread and MKL settings, before paddle is imported

DEFAULT_MODEL = os.path.join(ROOT, "checkpoints", "smollm2-135m-instruct")
TASKS = {
    "tool": ["--environment", "tools", "--environment_args", json.dumps({"tools": ["calculator"],
                                                                        "format": "hermes-compact"}),
             "--max_turns", "3", "--max_trajectory_tokens", "112", "--max_length", "256", "--reward_funcs",
             "accuracy", "--train_datasets", "prompt-only:1.0:data/tool_arithmetic/heldout.jsonl"],
    "reasoning": ["--max_length", "160", "--reward_funcs", "accuracy",
                  "--train_datasets", "prompt-only:1.0:data/chain_sum/chain_sum_eval.jsonl"],
    "dialogue": ["--max_length", "160", "--reward_funcs", "sentiment",
                 "--train_datasets", "prompt-only:1.0:data/prompts/eval.jsonl"],
}


def mode_flags(args) -> dict:
    return {"plain": [], "lookup": ["--prompt_lookup_num_tokens", str(args.lookup)],
            "draft": ["--speculative_draft_keep_every", str(args.keep_every), "--num_assistant_tokens",
                      str(args.assistant_tokens)]}


def one_step(args, task: str, flags: list, where: str) -> dict:
    """One GRPO step of `task` with `flags`, in a process of its own (the models of one run freed with it); -> its
    metrics row (the step's timers)."""
    out = os.path.join(where, "out")
    shutil.rmtree(out, ignore_errors=True)
    argv = ["--actor_model_name_or_path", args.model, "--output_dir", out, "--disable_tqdm", "--eval_datasets", "",
            "--advantage_estimator", "grpo", "--max_steps", "1", "--logging_steps", "1", "--save_steps", "0",
            "--per_device_prompt_batch_size", str(args.prompts), "--num_return_sequences", str(args.group),
            "--per_device_train_batch_size", str(args.prompts * args.group), "--max_new_tokens",
            str(args.new_tokens), "--temperature", "1.0", "--kl_coeff", "0.0", "--learning_rate", "1e-6",
            "--seed", "42", *TASKS[task], *flags]
    done = subprocess.run([sys.executable, "-m", "alignment.ppo.run_ppo", *argv], cwd=ROOT,  # the tasks' data paths
                          stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    if done.returncode:
        raise SystemExit(f"{task} {' '.join(flags)}: the run failed: {done.stderr.strip().splitlines()[-1:]}")
    with open(os.path.join(out, "metrics.jsonl"), encoding="utf-8") as f:
        return [json.loads(line) for line in f][-1]


def summary(rows: list) -> dict:
    """Medians of the repeats of one task and mode."""
    generate = statistics.median(r["time/generate"] for r in rows)
    step = statistics.median(r["time/generate"] + r["time/score"] + r["time/train"] for r in rows)
    tokens = statistics.median(r["time/generated_tokens_per_s"] * r["time/generate"] for r in rows)
    return {"generate_s": generate, "step_s": step, "generated_tokens": tokens,
            "tokens_per_s": statistics.median(r["time/generated_tokens_per_s"] for r in rows),
            "response_length": statistics.median(r["response_length"] for r in rows)}


def main(argv=None) -> list:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=DEFAULT_MODEL)
    p.add_argument("--tasks", default="tool,reasoning,dialogue")
    p.add_argument("--modes", default="plain,lookup,draft")
    p.add_argument("--prompts", type=int, default=2, help="prompts per step")
    p.add_argument("--group", type=int, default=4, help="answers per prompt (num_return_sequences)")
    p.add_argument("--new-tokens", type=int, default=48, help="max_new_tokens (per turn)")
    p.add_argument("--lookup", type=int, default=4, help="prompt_lookup_num_tokens")
    p.add_argument("--keep-every", type=int, default=2, help="speculative_draft_keep_every")
    p.add_argument("--assistant-tokens", type=int, default=3, help="num_assistant_tokens")
    p.add_argument("--repeats", type=int, default=3)
    from benchmarks import record

    record.add_arguments(p)
    args = p.parse_args(argv)
    from benchmarks.bench_smollm2 import ensure_checkpoint

    ensure_checkpoint(args.model)
    tasks, modes, flags = args.tasks.split(","), args.modes.split(","), mode_flags(args)
    where = tempfile.mkdtemp(prefix="bench-speculative-rl-")
    rows = []
    try:
        for task in tasks:
            runs = {mode: [] for mode in modes}
            for _ in range(args.repeats):
                for mode in modes:
                    runs[mode].append(one_step(args, task, flags[mode], where))
                    row = runs[mode][-1]
                    print(f"  {task} {mode}: generate {row['time/generate']:.1f} s, "
                          f"{row['time/generated_tokens_per_s']:.1f} tokens/s, step "
                          f"{row['time/generate'] + row['time/score'] + row['time/train']:.1f} s", flush=True)
            base = summary(runs[modes[0]])
            for mode in modes:
                row = {"task": task, "mode": mode, **summary(runs[mode])}
                row["tokens_per_s_ratio"] = row["tokens_per_s"] / base["tokens_per_s"]
                row["step_speedup"] = base["step_s"] / row["step_s"]
                rows.append(row)
                print(f"{task} {mode}: {row['tokens_per_s']:.1f} tokens/s ({row['tokens_per_s_ratio']:.2f}x), "
                      f"step {row['step_s']:.1f} s ({row['step_speedup']:.2f}x)", flush=True)
    finally:
        shutil.rmtree(where, ignore_errors=True)
    lines = ["| task | decoding | generated tokens | generate tokens/s | vs plain | RL step s | step speed-up |",
             "| --- | --- | ---: | ---: | ---: | ---: | ---: |"]
    lines += [f"| {r['task']} | {r['mode']} | {r['generated_tokens']:.0f} | {r['tokens_per_s']:.1f} | "
              f"{r['tokens_per_s_ratio']:.2f}x | {r['step_s']:.1f} | {r['step_speedup']:.2f}x |" for r in rows]
    print("\n".join(lines) + f"\n\n(GRPO, {args.prompts} prompts x {args.group} answers, temperature 1, up to "
          f"{args.new_tokens} new tokens a turn, prompt_lookup_num_tokens {args.lookup}, draft: layers kept every "
          f"{args.keep_every}, {args.assistant_tokens} tokens; medians of {args.repeats}; "
          f"{os.path.basename(os.path.normpath(args.model))}; {describe_machine(machine_facts())})")
    if not args.no_save:
        settings = {"model": os.path.basename(os.path.normpath(args.model)), "prompts": args.prompts,
                    "group": args.group, "new_tokens": args.new_tokens, "lookup": args.lookup,
                    "keep_every": args.keep_every, "assistant_tokens": args.assistant_tokens,
                    "repeats": args.repeats}
        record.save("speculative_rl", {**settings, "rows": rows}, record.results_dir(args))
    return rows


if __name__ == "__main__":
    main()
