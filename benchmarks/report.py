"""Reports of benchmarks/bench_rl_step.py: a Markdown table, the raw JSON and a per-phase PNG chart per run."""
from __future__ import annotations

import json
import os

from alignment.cpu_env import describe_machine
from benchmarks import record


def result_tag(result: dict) -> str:
    return result["algo"] if result.get("variant", "default") == "default" else f"{result['algo']}-{result['variant']}"


def render_markdown(result: dict, rows, stamp: str) -> str:
    tag = result_tag(result)
    warmup = result["warmup"]
    s = result["settings"]
    lines = [
        f"# {result['algo'].upper()} step benchmark "
        f"({stamp}{'' if tag == result['algo'] else ', ' + result['variant']})",
        "",
        f"`python benchmarks/bench_rl_step.py --algo {result['algo']} --steps {result['steps']} --warmup {warmup}"
        f"{'' if tag == result['algo'] else ' --stride-kernel on'}`",
        "",
        f"Shape: LLaMA hidden 256, intermediate 1024, 4 layers, 4 heads (kv 4), vocab 8000, fp32 "
        f"(policy {result['params']['policy'] / 1e6:.2f}M params); {result['samples_per_step']} rollouts per step "
        f"({s['prompts_per_step']} prompts x {s['completions_per_prompt']}), {result['response_len']} new tokens, "
        f"padded prompt width {result['prompt_width_mean']:.1f}; update_iters {s['update_iters']}, micro-batch "
        f"{s['micro_batch']}; temperature {s['temperature']}, lr {s['learning_rate']}, kl {s['kl_coeff']} "
        f"({s['kl_estimator']}, {'in the loss' if s['kl_in_loss'] else 'in the reward'}).",
        "",
        "| metric | value |",
        "| --- | --- |",
        f"| median step (s, after {warmup} warmup) | {result['sec_per_step_median']:.3f} |",
        f"| samples/s | {result['samples_per_sec']:.2f} |",
        f"| generate / score / train median (s) | {result['generate_s_median']:.3f} / "
        f"{result['score_s_median']:.3f} / {result['train_s_median']:.3f} |",
        f"| decode (ms per new token, whole batch) | {result['decode_ms_per_token']:.1f} |",
        f"| update: passes x tokens per pass | {result['update_passes']} x "
        f"{result['update_tokens_per_step'] // max(1, result['update_passes'])} |",
        f"| update: training tokens/s | {result['train_tokens_per_s']:.0f} |",
        f"| update: GFLOP/s (6 x params x tokens) | {result['update_gflops_per_s']:.2f} |",
        f"| fp32 matmul peak GFLOP/s (best of {', '.join(result['matmul_peak_by_size'])}^3) | "
        f"{result['matmul_peak_gflops']:.1f} |",
        f"| update fraction of peak | {100 * result['update_fraction_of_peak']:.1f}% |",
        f"| update fraction of peak, matmul FLOPs only (no embedding tables; LM head on response tokens) | "
        f"{100 * result['update_matmul_fraction_of_peak']:.1f}% |" if "update_matmul_fraction_of_peak" in result
        else "| update fraction of peak, matmul FLOPs only | (not recorded) |",
        f"| machine | {describe_machine(result['machine']) if 'machine' in result else '(not recorded)'} |",
        f"| load average before / after (1 min, {result['load_before'].get('cpu_count')} CPUs) | "
        f"{result['load_before'].get('loadavg_1m')} / {result['load_after'].get('loadavg_1m')} |",
        "",
        "| step | total (s) | generate (s) | score (s) | train (s) |",
        "| --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        note = " (warmup)" if r["step"] <= warmup else ""
        lines.append(f"| {r['step']}{note} | {r['total_s']:.3f} | {r['generate_s']:.3f} | {r['score_s']:.3f} | "
                     f"{r['train_s']:.3f} |")
    lines += ["", f"Environment: {json.dumps(result['env'])}", ""]
    return "\n".join(lines)


def write_reports(result: dict, rows, results_dir: str) -> list:
    """<tag>_<stamp>.json (benchmarks/record.py's header + the figures), .md (a table) and .png (a chart)."""
    stamp = record.stamp()
    tag = result_tag(result)
    base = os.path.join(results_dir, f"{tag}_{stamp}")
    written = [record.save(tag, {"result": result, "steps": rows}, results_dir, machine=result.get("machine"),
                           when=stamp)]
    text = render_markdown(result, rows, stamp)
    warmup = result["warmup"]
    with open(base + ".md", "w", encoding="utf-8") as f:
        f.write(text)
    written.append(base + ".md")
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(8, 4))
        x = [r["step"] for r in rows]
        bottom = [0.0] * len(rows)
        for key, color in (("generate_s", "#4c72b0"), ("score_s", "#dd8452"), ("train_s", "#55a868")):
            values = [r[key] for r in rows]
            ax.bar(x, values, bottom=bottom, color=color, label=key[:-2])
            bottom = [b + v for b, v in zip(bottom, values)]
        ax.axhline(result["sec_per_step_median"], color="black", linestyle="--", linewidth=1,
                   label=f"median {result['sec_per_step_median']:.3f}s")
        ax.set_xlabel("step (first %d = warmup)" % warmup)
        ax.set_ylabel("seconds")
        ax.set_title(f"{result['algo'].upper()} step time by phase ({result['samples_per_step']} rollouts x "
                     f"{result['response_len']} tokens)")
        ax.legend()
        fig.tight_layout()
        fig.savefig(base + ".png", dpi=100)
        plt.close(fig)
        written.append(base + ".png")
    except ImportError:
        print("matplotlib not installed: no chart written", flush=True)
    return written
