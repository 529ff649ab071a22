"""Peak memory of PPO steps on SmolLM2-135M with full fine-tuning vs LoRA (actor and critic), side by side.

    python benchmarks/bench_lora_memory.py [--steps 2] [--config config/smollm2/ppo_argument.json]

Runs `alignment/ppo/run_ppo.py` twice in child processes (no evaluation, `--steps` steps, output in a temp dir):
once as configured, once with `--lora true --critic_lora true`. Reports each child's peak resident memory (the
kernel's ru_maxrss of that child) and mean step times from its metrics.jsonl. With LoRA the reference model is the actor with its
adapters off (no second copy), and AdamW keeps moments for the adapters only. Needs the SmolLM2 demo's SFT and
reward-model outputs (bash examples/quickstart.sh) or the paths given in the config.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run(config: str, steps: int, output_dir: str, extra) -> dict:
    """Run PPO in a child process; return its peak RSS (GiB, from wait4's rusage) and metrics rows."""
    cmd = [sys.executable, os.path.join(REPO, "alignment", "ppo", "run_ppo.py"), config, "--max_steps", str(steps),
           "--eval_datasets", "", "--output_dir", output_dir, "--disable_tqdm", "--logging_steps", "1", *extra]
    log = output_dir + ".log"
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, cwd=REPO, stdout=out, stderr=subprocess.STDOUT)
        _, status, usage = os.wait4(proc.pid, 0)
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"run failed ({' '.join(cmd)}):\n{open(log).read()[-3000:]}")
    rows = [json.loads(line) for line in open(os.path.join(output_dir, "metrics.jsonl"))]
    return {"peak_rss_gb": usage.ru_maxrss / 1024**2, "rows": rows}  # ru_maxrss is in KiB on Linux


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--config", default=os.path.join(REPO, "config", "smollm2", "ppo_argument.json"))
    p.add_argument("--steps", type=int, default=2)
    p.add_argument("--lora-rank", type=int, default=8)
    sys.path.insert(0, REPO)
    from benchmarks import record

    record.add_arguments(p)
    args = p.parse_args(argv)
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, extra in (("full", []), ("lora", ["--lora", "true", "--critic_lora", "true",
                                                    "--lora_rank", str(args.lora_rank)])):
            outcome = run(args.config, args.steps, os.path.join(tmp, name), extra)
            rows = outcome["rows"]
            results[name] = {
                "peak_rss_gb": round(outcome["peak_rss_gb"], 3),
                "time_generate_s": round(sum(r["time/generate"] for r in rows) / len(rows), 2),
                "time_score_s": round(sum(r["time/score"] for r in rows) / len(rows), 2),
                "time_train_s": round(sum(r["time/train"] for r in rows) / len(rows), 2),
            }
            print(f"{name}: {results[name]}", flush=True)
    saved = results["full"]["peak_rss_gb"] - results["lora"]["peak_rss_gb"]
    print(f"peak RSS: full {results['full']['peak_rss_gb']:.2f} GiB, LoRA {results['lora']['peak_rss_gb']:.2f} GiB "
          f"(saved {saved:.2f} GiB, {saved / results['full']['peak_rss_gb']:.0%})")
    print("RESULT " + json.dumps(results))
    if not args.no_save:
        record.save("lora_memory", {"steps": args.steps, "lora_rank": args.lora_rank, "runs": results},
                    record.results_dir(args))
    return results


if __name__ == "__main__":
    main()
