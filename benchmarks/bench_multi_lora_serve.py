"""Peak resident memory of one `alignment-serve` with N LoRA adapters on one base against N single-adapter servers.

    python benchmarks/bench_multi_lora_serve.py [--adapters 3] [--rank 8] [--smollm2-dir DIR] [--skip-smollm2]
        [--max-sequences 8] [--max-length 256] [--max-tokens 16] [--results-dir DIR | --record | --no-save]

For each model (the tiny model of tools/make_tiny.py, built in a temporary directory, and SmolLM2-135M-Instruct
from --smollm2-dir when it holds a checkpoint): N adapters of rank --rank on every projection, with random A and B,
saved in PEFT's layout; then, each in a child process of its own, one after the other: the base served alone, one
server with all N adapters (`--adapter name=DIR` N times), and N servers with one adapter each. Each server gets
one greedy chat request per model it serves (so prefill and decode ran), then is stopped; its peak resident memory
is the kernel's ru_maxrss of that child (os.wait4). Reported per model: the base alone, the N-adapter server, the
sum over the N single-adapter servers (what N separate servers hold at once) and the ratio; the run stops with an
error when an adapter's answer from the shared server is not the single-adapter server's text.
Writes multi_lora_serve_<timestamp>.json where benchmarks/record.py's flags say (--record: benchmarks/results/).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if not __package__:  # run as a script from a checkout: make `alignment` and `benchmarks` importable
    sys.path.insert(0, ROOT)

from alignment.commands.tool_parser import ToolParser, positive_int  # noqa: E402
from benchmarks import record  # noqa: E402

QUESTION = [{"role": "user", "content": "What is two plus two?"}]


def make_adapters(base: str, folder: str, count: int, rank: int) -> dict:
    """{name: directory} of `count` random adapters of `base` (seeded by their index)."""
    import numpy as np
    import paddle

    from alignment.models import LlamaForCausalLM
    from alignment.models.lora import apply_lora, save_adapter

    out = {}
    for index in range(count):
        model = LlamaForCausalLM.from_pretrained(base)
        apply_lora(model, rank, 2.0 * rank, 0.0)
        rng = np.random.default_rng(index)
        for name, param in model.named_parameters():
            if ".lora_" in name:
                param.set_value(paddle.to_tensor(rng.normal(0, 0.02, param.shape).astype("float32")))
        out[f"adapter{index}"] = os.path.join(folder, f"adapter{index}")
        save_adapter(model, out[f"adapter{index}"], base, "CAUSAL_LM")
        del model
    return out


def served(base: str, adapters: dict, args, folder: str) -> dict:
    """Serve `base` with `adapters` in a child, ask each served model once (greedy); -> peak RSS MiB, answers."""
    import openai

    port_file = os.path.join(folder, f"port-{len(os.listdir(folder))}")
    flags = [f for name, path in adapters.items() for f in ("--adapter", f"{name}={path}")]
    log = open(port_file + ".log", "w")
    proc = subprocess.Popen([sys.executable, os.path.join(ROOT, "tools", "serve.py"), "--model", base, "--name",
                             "base", *flags, "--port", "0", "--port-file", port_file, "--max-sequences",
                             str(args.max_sequences), "--max-length", str(args.max_length)],
                            cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
    deadline = time.time() + 600
    while not os.path.exists(port_file) and proc.poll() is None and time.time() < deadline:
        time.sleep(0.2)
    answers = {}
    try:
        if not os.path.exists(port_file):
            raise SystemExit(f"the server did not start:\n{open(port_file + '.log').read()[-3000:]}")
        with open(port_file, encoding="utf-8") as f:
            client = openai.OpenAI(base_url=f"http://127.0.0.1:{f.read().strip()}/v1", api_key="none",
                                   max_retries=0, timeout=600)
        for name in ["base", *adapters]:
            reply = client.chat.completions.create(model=name, messages=QUESTION, temperature=0,
                                                   max_tokens=args.max_tokens)
            answers[name] = reply.choices[0].message.content
    finally:
        proc.terminate()
        _, _, usage = os.wait4(proc.pid, 0)
        log.close()
    return {"peak_rss_mib": usage.ru_maxrss / 1024, "answers": answers}  # ru_maxrss is in KiB on Linux


def measure(name: str, base: str, args, work: str) -> dict:
    folder = os.path.join(work, name)
    os.makedirs(folder)
    adapters = make_adapters(base, folder, args.adapters, args.rank)
    adapter_mib = sum(os.path.getsize(os.path.join(d, "adapter_model.safetensors")) for d in adapters.values())
    alone = served(base, {}, args, folder)
    shared = served(base, adapters, args, folder)
    singles = {n: served(base, {n: d}, args, folder) for n, d in adapters.items()}
    for n, single in singles.items():
        if single["answers"][n] != shared["answers"][n]:
            raise SystemExit(f"{name}: {n} answered {shared['answers'][n]!r} on the shared server, "
                             f"{single['answers'][n]!r} alone")
    total = sum(s["peak_rss_mib"] for s in singles.values())
    row = {"model": name, "adapters": args.adapters, "rank": args.rank,
           "adapter_files_mib": round(adapter_mib / 2**20, 2),
           "base_alone_mib": round(alone["peak_rss_mib"], 1), "shared_server_mib": round(shared["peak_rss_mib"], 1),
           "single_servers_mib": [round(s["peak_rss_mib"], 1) for s in singles.values()],
           "single_servers_total_mib": round(total, 1), "shared_over_singles": round(shared["peak_rss_mib"] / total, 3),
           "same_answers": True}
    print(json.dumps(row), flush=True)
    return row


def main(argv=None) -> dict:
    p = ToolParser(__doc__)
    p.add_argument("--adapters", type=positive_int, default=3)
    p.add_argument("--rank", type=positive_int, default=8)
    p.add_argument("--smollm2-dir", default=os.path.join(ROOT, "checkpoints", "smollm2-135m-instruct"))
    p.add_argument("--skip-smollm2", action="store_true")
    p.add_argument("--max-sequences", type=positive_int, default=8)
    p.add_argument("--max-length", type=positive_int, default=256)
    p.add_argument("--max-tokens", type=positive_int, default=16)
    p.add_argument("--note", default="")
    record.add_arguments(p)
    args = p.parse_args(argv)
    rows = []
    with tempfile.TemporaryDirectory(prefix="multi-lora-") as work:
        from alignment.commands import make_tiny

        tiny = make_tiny.main(["--output", os.path.join(work, "tiny-model")])
        rows.append(measure("tiny", tiny, args, work))
        if not args.skip_smollm2 and os.path.isfile(os.path.join(args.smollm2_dir, "config.json")):
            rows.append(measure("SmolLM2-135M-Instruct", os.path.abspath(args.smollm2_dir), args, work))
    result = {"max_sequences": args.max_sequences, "max_length": args.max_length, "max_tokens": args.max_tokens,
              "note": args.note, "rows": rows}
    if not args.no_save:
        record.save("multi_lora_serve", result, record.results_dir(args))
    return result


if __name__ == "__main__":
    main()
