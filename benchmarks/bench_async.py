#!/usr/bin/env python
"""Synchronous vs asynchronous PPO at equal total cores: two data-parallel processes that each generate and train,
against one rollout rank beside one training rank with max_staleness 1 and 2
(alignment/ppo/asynchronous/asynchronous.py).

    python benchmarks/bench_async.py [--steps 8] [--new-tokens 32] [--prompts 16] [--env-wait 0.25]

The TRL peer's shape (benchmarks/peer_shape.py: an 8.29M-parameter LLaMA policy, reward and value models, built
offline), PPO with a critic, the same global batch of prompts per step in every run. Per run: the median wall time
per step (steps 2..N, from the trainer's step start times) and trained tokens per second (response tokens of the
global batch / step time), as ratios to the synchronous run measured in the same invocation; a timeline PNG of the
max_staleness 1 run (the training rank's generate-wait / score / train phases, the rollout rank's weight wait,
sampling and posting per batch). Prints one `RESULT {json}` line; writes async_<time>.{json,png} (benchmarks/record.py:
--results-dir, --record, --no-save).

--env-wait S: a tool-latency workload instead: every episode plays 3 turns against an environment whose each step
waits S seconds (a remote tool), so the waits of the next batch's episodes overlap this step's training in the
asynchronous runs; written as async_env_wait_<time>.{json,png}.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

import peer_shape  # noqa: E402

from alignment.cpu_env import machine_facts  # noqa: E402
from benchmarks import record  # noqa: E402


def build(workdir: str, prompts: int) -> dict:
    tokenizer = peer_shape.build_tokenizer(os.path.join(workdir, "tokenizer"))
    paths = peer_shape.build_checkpoints(tokenizer, workdir, seed=0)
    data = os.path.join(workdir, "prompts.jsonl")
    with open(data, "w", encoding="utf-8") as f:
        for text in peer_shape.prompt_texts(max(prompts * 4, 64)):
            f.write(json.dumps({"prompt": text}) + "\n")
    return {**paths, "data": data}


WAITING_ENV = """
import time
from alignment.envs import Environment, StepResult

class Waiting(Environment):
    NAME = "bench-waiting"

    def __init__(self, wait=0.25):
        self.wait = wait

    def reset(self, row):
        self.turn = 0
        return [{"role": "user", "content": row["input"]}]

    def step(self, text):
        time.sleep(self.wait)
        self.turn += 1
        return StepResult([{"role": "user", "content": "Go on."}], 0.0, False)
"""


def environment_args(workdir: str, wait: float, new_tokens: int) -> list:
    """The flags of the tool-latency workload: 3 turns of new_tokens each against a step that waits `wait` s."""
    path = os.path.join(workdir, "waiting_env.py")
    with open(path, "w", encoding="utf-8") as f:
        f.write(WAITING_ENV)
    return ["--environment", "bench-waiting", "--environment_args", json.dumps({"wait": wait}),
            "--user_env_modules", path, "--max_turns", "3", "--max_trajectory_tokens", str(4 * new_tokens + 60),
            "--max_length", str(5 * new_tokens + 160)]


def run(name: str, paths: dict, out: str, steps: int, new_tokens: int, prompts: int, extra: list, log: str) -> None:
    per_rank = prompts // 2 if "--rollout_ranks" not in extra else prompts
    args = [os.path.join(REPO, "alignment", "ppo", "run_ppo.py"), os.path.join(REPO, "config", "tiny",
                                                                            "ppo_argument.json"),
            "--actor_model_name_or_path", paths["policy"], "--reward_model_name_or_path", paths["reward"],
            "--reward_critic_model_name_or_path", paths["value"],
            "--train_datasets", f"prompt-only:1.0:{paths['data']}",
            "--eval_datasets", "", "--max_steps", str(steps), "--max_new_tokens", str(new_tokens),
            "--min_new_tokens", str(new_tokens),
            *([] if "--max_length" in extra else ["--max_length", str(new_tokens + 96)]),
            "--per_device_prompt_batch_size", str(per_rank), "--per_device_train_batch_size", str(per_rank),
            "--logging_steps", "1", "--disable_tqdm", "--output_dir", out, *extra]
    cmd = [sys.executable, "-m", "paddle.distributed.launch", "--nproc_per_node", "2", "--log_dir", log, *args]
    start = time.time()
    done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"{name}: exit {done.returncode}\n{done.stdout[-3000:]}\n{done.stderr[-2000:]}")
    print(f"{name}: {time.time() - start:.1f} s", flush=True)


def figures(out: str, prompts: int, new_tokens: int) -> dict:
    rows = [json.loads(line) for line in open(os.path.join(out, "metrics.jsonl"))]
    starts = [row["time/step_start"] for row in rows]
    steps = [b - a for a, b in zip(starts[1:], starts[2:])]  # steps 2 .. N-1 (the last has no successor)
    step = statistics.median(steps)
    return {"median_step_s": step, "trained_tokens_per_s": prompts * new_tokens / step,
            "generate_wait_s": statistics.median(r["time/generate"] for r in rows[1:]),
            "train_s": statistics.median(r["time/train"] for r in rows[1:]),
            "score_s": statistics.median(r["time/score"] for r in rows[1:])}


def cpu_line(workerlog: str) -> str:
    """The training rank's `cpu:` line: its thread settings (chosen per rank under the launch)."""
    with open(workerlog, encoding="utf-8", errors="replace") as f:
        return next((line.strip() for line in f if line.startswith("cpu: ")), "")


def timeline(out: str, png: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [json.loads(line) for line in open(os.path.join(out, "metrics.jsonl"))]
    batches = [json.loads(line) for line in open(os.path.join(out, "rollout_rank1.jsonl"))]
    zero = min(rows[0]["time/step_start"], batches[0]["wait_start"])
    fig, ax = plt.subplots(figsize=(11, 2.8))
    for row in rows:
        t = row["time/step_start"] - zero
        for phase, colour in (("time/weight_sync", "tab:purple"), ("time/generate", "tab:grey"),
                              ("time/score", "tab:orange"), ("time/train", "tab:blue")):
            ax.broken_barh([(t, row.get(phase, 0.0))], (10, 8), color=colour)
            t += row.get(phase, 0.0)
    for b in batches:
        for start, end, colour in (("wait_start", "sample_start", "tab:grey"), ("sample_start", "post_start",
                                                                               "tab:green"),
                                   ("post_start", "post_end", "tab:grey")):
            ax.broken_barh([(b[start] - zero, b[end] - b[start])], (0, 8), color=colour)
    ax.set_yticks([4, 14], ["rollout rank", "training rank"])
    ax.set_xlabel("seconds (green: sampling; blue: training; orange: scoring; purple: weight send; grey: waiting)")
    fig.tight_layout()
    fig.savefig(png, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--prompts", type=int, default=16, help="prompts per step (global batch), even")
    parser.add_argument("--env-wait", type=float, default=0.0,
                        help="seconds each environment step waits: a 3-turn tool-latency workload (0: single-turn)")
    record.add_arguments(parser)
    args = parser.parse_args()
    benchmark = "async_env_wait" if args.env_wait > 0 else "async"
    stamp = record.stamp()
    results_dir = record.results_dir(args)
    if not args.no_save:
        os.makedirs(results_dir, exist_ok=True)
    with tempfile.TemporaryDirectory() as work:
        paths = build(work, args.prompts)
        workload = environment_args(work, args.env_wait, args.new_tokens) if args.env_wait > 0 else []
        runs = {"sync, 2 data-parallel ranks": [], "async, max_staleness 1": ["--rollout_ranks", "1",
                                                                              "--max_staleness", "1"],
                "async, max_staleness 2": ["--rollout_ranks", "1", "--max_staleness", "2"]}
        results = {}
        for name, extra in runs.items():
            out = os.path.join(work, name.replace(" ", "_").replace(",", ""))
            run(name, paths, out, args.steps, args.new_tokens, args.prompts, extra + workload, out + "-logs")
            results[name] = figures(out, args.prompts, args.new_tokens)
            results[name]["rank0_cpu"] = cpu_line(os.path.join(out + "-logs", "workerlog.0"))
            if "staleness 1" in name and not args.no_save:
                timeline(out, os.path.join(results_dir, f"{benchmark}_{stamp}.png"))
    base = results["sync, 2 data-parallel ranks"]["median_step_s"]
    for figure in results.values():
        figure["step_time_vs_sync"] = figure["median_step_s"] / base
    report = {"machine": machine_facts(), "steps": args.steps, "new_tokens": args.new_tokens,
              "prompts": args.prompts, "env_wait": args.env_wait, "runs": results}
    machine = report.pop("machine")
    if not args.no_save:
        record.save(benchmark, report, results_dir, machine=machine, when=stamp)
    for name, figure in results.items():
        print(f"{name}: {figure['median_step_s']:.3f} s/step ({figure['step_time_vs_sync']:.2f}x sync), "
              f"{figure['trained_tokens_per_s']:.0f} trained tokens/s; rank 0 {figure['rank0_cpu']}")
    print("RESULT " + json.dumps(report))


if __name__ == "__main__":
    main()
