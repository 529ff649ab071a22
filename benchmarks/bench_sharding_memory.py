"""Peak resident memory per rank of sharding stages 0-3 on 4 processes, against the layout planner's prediction.

    python benchmarks/bench_sharding_memory.py [--steps 2] [--results-dir DIR | --record | --no-save]

Builds a random LLaMA wide enough that its parameters dominate (hidden 1024, MLP 2816, 8 layers, 16 heads, untied,
the tiny tokenizer's vocabulary of 1024: 104.9M parameters, 0.39 GiB in fp32) next to the tiny model, then runs
`alignment/sft/run_sft.py` under `paddle.distributed.launch` on 4 processes (gloo) with `benchmark: true` (no
evaluation, nothing saved: training only) for each of sharding '' (4 data ranks), stage1, stage2 and stage3 over
the 4 ranks, sharding_segment_size 65536 (every matrix split, the norms whole). The run's benchmark lines give each
rank's peak RSS while training (VmHWM reset when training starts; glibc's malloc set to return freed tensors, so
the whole model each rank loads before stage 3 slices it does not count: ALIGNMENT_MALLOC=system,
MALLOC_MMAP_THRESHOLD_=65536) and the weights and AdamW states it holds. The runtime under them (Paddle, gloo, data, the
tokenizer) is measured the same way with the tiny model (1.0M parameters) and given to the planner
(alignment/planning/memory.py, `tools/plan_layout.py --device cpu --runtime-gib`), whose train-phase total for
the same layout is the prediction. Writes sharding_memory_<stamp>.{json,md,png} (CPU, date, commit and machine in
the JSON; the directory as benchmarks/record.py's flags say). `--repredict FILE.json` measures nothing: it
recomputes the planner's predictions for the file's measurements (after a change to the memory model) and rewrites
the file, its table and plot (the commit of the predictions is recorded beside the measurement's).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from alignment.cpu_env import machine_facts  # noqa: E402

WIDE = dict(hidden_size=1024, intermediate_size=2816, num_hidden_layers=8, num_attention_heads=16,
            num_key_value_heads=16)
STAGES = ("", "stage1", "stage2", "stage3")
PROCESSES, SEGMENT, SEQ, MICRO = 4, 65536, 64, 2
MALLOC = {"ALIGNMENT_MALLOC": "system", "MALLOC_MMAP_THRESHOLD_": "65536"}  # freed tensors leave the process
LINES = {"peak_rss": "peak resident memory", "weights": "trained weights held", "adamw": "AdamW states held"}


def cpu_name() -> str:
    info = open("/proc/cpuinfo").read()
    fields = {key: re.search(rf"^{key}\s*:\s*(.+)$", info, re.M) for key in ("model name", "cpu family", "model")}
    flags = re.search(r"^flags\s*:\s*(.+)$", info, re.M).group(1).split()
    isa = "AVX-512" if "avx512f" in flags else "AVX2" if "avx2" in flags else "no AVX2"
    return (f"{fields['model name'].group(1)} (family {fields['cpu family'].group(1)}, model "
            f"{fields['model'].group(1)}, {isa}), {os.cpu_count()} cores")


def build_models(workdir: str) -> dict:
    """The tiny model (tools/make_tiny.py) and the wide one, which shares its tokenizer."""
    import paddle

    from alignment.commands import make_tiny
    from alignment.models import LlamaConfig, LlamaForCausalLM

    tiny = make_tiny.main(["--output", os.path.join(workdir, "tiny")])
    config = dataclasses.replace(LlamaConfig.from_pretrained(tiny), **WIDE, head_dim=None)  # head_dim: h / heads
    paddle.seed(5)
    wide = os.path.join(workdir, "wide")
    LlamaForCausalLM(config).save_pretrained(wide, tokenizer_dir=tiny)
    return {"tiny": tiny, "wide": wide}


def run(model: str, stage: str, steps: int, workdir: str) -> dict:
    """One 4-process SFT benchmark run; {"peak_rss" | "weights" | "adamw": [GiB per rank], "seconds": wall}."""
    name = f"{os.path.basename(model)}-{stage or 'none'}"
    out, logs = os.path.join(workdir, name), os.path.join(workdir, name + "-logs")
    cmd = [sys.executable, "-m", "paddle.distributed.launch", "--nproc_per_node", str(PROCESSES), "--log_dir", logs,
           os.path.join(REPO, "alignment", "sft", "run_sft.py"), os.path.join(REPO, "config", "tiny",
                                                                              "sft_argument.json"),
           "--model_name_or_path", model, "--train_datasets", f"alpaca:1.0:{REPO}/data/sft/train.jsonl",
           "--eval_datasets", "", "--benchmark", "true", "--max_steps", str(steps), "--max_length", str(SEQ),
           "--per_device_train_batch_size", str(MICRO), "--gradient_accumulation_steps", "1", "--disable_tqdm",
           "--sharding", stage, "--sharding_segment_size", str(SEGMENT), "--output_dir", out]
    started = time.time()
    done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, env=dict(os.environ, **MALLOC))
    text = open(os.path.join(logs, "workerlog.0")).read() if os.path.exists(logs) else ""
    if done.returncode != 0:
        raise SystemExit(f"{name} failed:\n{done.stderr[-2000:]}\n{text[-3000:]}")
    result = {"seconds": round(time.time() - started, 1)}
    for key, line in LINES.items():
        found = re.search(rf"^{line} per rank \(GiB\): (.+)$", text, re.M)
        result[key] = [float(v) for v in found.group(1).split()]
    return result


def planner_model(config: dict):
    """The planner's Model of a results file's model config."""
    from alignment.planning.memory import Model

    heads = config["num_attention_heads"]
    return Model(config["hidden_size"], config["intermediate_size"], config["num_hidden_layers"], heads,
                 config["num_key_value_heads"], config["hidden_size"] // heads, config["vocab_size"])


def predict(config: dict, stage: str, runtime_gib: float) -> dict:
    """The planner's components and train-phase total (GiB per rank) for the run's layout."""
    from alignment.parallel.layout import Layout
    from alignment.planning.memory import GIB, Plan, memory

    lay = Layout(PROCESSES, 1, 1, PROCESSES if stage else 1, stage)
    plan = Plan(stage="sft", seq=SEQ, response=SEQ, micro=MICRO, dtype="fp32", device="cpu",
                runtime_bytes=runtime_gib * GIB, segment=SEGMENT)
    mem = memory(planner_model(config), lay, plan)
    parts = {k: mem["components"][k] / GIB for k in ("trained_weights", "grads", "adamw", "gathered", "activations")}
    return {**{k: round(v, 4) for k, v in parts.items()}, "train_total": round(mem["phases"]["train"] / GIB, 4)}


def render(result: dict) -> str:
    rows = ["| sharding | peak RSS per rank, measured (GiB) | predicted (GiB) | error | weights held | "
            "AdamW held | weights, predicted |", "| --- | --- | --- | --- | --- | --- | --- |"]
    for row in result["rows"]:
        measured = max(row["peak_rss"])
        rows.append(f"| {row['stage'] or 'none (4 data ranks)'} | {measured:.2f} (ranks: "
                    f"{', '.join(f'{v:.2f}' for v in row['peak_rss'])}) | {row['predicted']['train_total']:.2f} | "
                    f"{(row['predicted']['train_total'] - measured) / measured:+.0%} | {max(row['weights']):.3f} | "
                    f"{max(row['adamw']):.3f} | {row['predicted']['trained_weights']:.3f} |")
    stage3, none = result["rows"][-1], result["rows"][0]
    return "\n".join([
        f"# Sharding stages on {PROCESSES} processes: peak memory per rank", "",
        f"{result['cpu']}; {result['date']}; commit {result['commit']}"
        + (f" (predictions: commit {result['predicted_at_commit']})" if "predicted_at_commit" in result else "")
        + ".", "",
        f"Model: {result['model']['parameters'] / 1e6:.1f}M parameters (fp32, untied), SFT, micro-batch {MICRO} x "
        f"{SEQ} tokens, {result['steps']} steps, `benchmark: true`, sharding_segment_size {SEGMENT}. Runtime under "
        f"the runs (tiny model, same settings): {result['runtime_gib']:.2f} GiB per rank, given to the planner.", "",
        *rows, "",
        f"Stage 3 holds {max(stage3['weights']) / max(none['weights']):.2f} of the unsharded run's weights per rank "
        f"and {max(stage3['adamw']) / max(none['adamw']):.2f} of its AdamW states (4 ranks: a quarter, plus the "
        "whole norms and Paddle's 4 KiB alignment padding of each slice on CPU)."])


def plot(result: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = [row["stage"] or "none" for row in result["rows"]]
    xs = range(len(labels))
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.bar([x - 0.2 for x in xs], [max(r["peak_rss"]) for r in result["rows"]], 0.4, label="measured peak RSS")
    ax.bar([x + 0.2 for x in xs], [r["predicted"]["train_total"] for r in result["rows"]], 0.4,
           label="planner prediction")
    ax.set_xticks(list(xs), labels)
    ax.set_ylabel("GiB per rank")
    ax.set_title(f"{result['model']['parameters'] / 1e6:.0f}M-parameter LLaMA, SFT on {PROCESSES} processes")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def write(result: dict, base: str) -> None:
    """base.json, base.md and base.png."""
    with open(base + ".json", "w") as f:
        json.dump(result, f, indent=1)
    with open(base + ".md", "w") as f:
        f.write(render(result) + f"\n\nRaw numbers: {os.path.basename(base)}.json\n")
    plot(result, base + ".png")
    print(f"wrote {base}.{{json,md,png}}")


def commit() -> str:
    return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True,
                          text=True).stdout.strip()


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=2)
    from benchmarks import record

    record.add_arguments(parser)
    parser.add_argument("--repredict", metavar="RESULT_JSON", help="measure nothing: recompute the planner's "
                        "predictions for a results file's measurements and rewrite it (.json, .md, .png)")
    args = parser.parse_args(argv)
    if args.repredict:
        with open(args.repredict) as f:
            result = json.load(f)
        for row in result["rows"]:
            row["predicted"] = predict(result["model"], row["stage"], result["runtime_gib"])
        result["predicted_at_commit"] = commit()
        print(render(result))
        write(result, args.repredict[:-len(".json")])
        return result
    from alignment.models import LlamaConfig
    from alignment.planning.memory import load_model, model_params

    with tempfile.TemporaryDirectory() as workdir:
        models = build_models(workdir)
        config = LlamaConfig.from_pretrained(models["wide"])
        model = {**WIDE, "vocab_size": config.vocab_size, "parameters": model_params(load_model(models["wide"]))}
        runtime = max(run(models["tiny"], "", args.steps, workdir)["peak_rss"])
        print(f"runtime (tiny model): {runtime:.3f} GiB per rank", flush=True)
        rows = []
        for stage in STAGES:
            row = {"stage": stage, **run(models["wide"], stage, args.steps, workdir),
                   "predicted": predict(model, stage, runtime)}
            print(json.dumps(row), flush=True)
            rows.append(row)
    result = {"benchmark": "sharding_memory", "machine": machine_facts(), "cpu": cpu_name(),
              "date": time.strftime("%Y-%m-%d %H:%M"), "commit": commit(), "steps": args.steps,
              "processes": PROCESSES, "seq": SEQ, "micro_batch": MICRO, "segment_size": SEGMENT, "model": model,
              "runtime_gib": runtime, "malloc": MALLOC, "rows": rows}
    print(render(result))
    if not args.no_save:
        directory = record.results_dir(args)
        os.makedirs(directory, exist_ok=True)
        write(result, os.path.join(directory, f"sharding_memory_{time.strftime('%Y%m%d-%H%M%S')}"))
    return result


if __name__ == "__main__":
    main()
