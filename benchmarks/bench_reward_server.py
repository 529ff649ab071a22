"""Load on the reward server (tools/reward_server.py): requests/s and latency, batching on vs off, overload memory.

    python benchmarks/bench_reward_server.py [--seconds 5] [--models tiny,smollm2] [--no-save]

For each model (the tiny RM; the SmolLM2 RM at outputs/smollm2-rm/model, or else a SmolLM2-135M score model with a
seeded random head built from checkpoints/smollm2-135m-instruct - the same forward cost) it starts the server
twice (micro-batching on: --max-batch 32, the requests that queue up while a batch runs form the next one; off:
--no-batching) and drives it with 1, 8 and 32 concurrent clients, each sending one-row PaddleNLP requests (a
shipped prompt + a canned reply) back to back: one warm-up request each, then at least --seconds and 2 requests
per client. Then a 10x overload: 10 x --max-queue requests at once, in 3 waves, against the batching server of
the last model: its peak resident memory (VmHWM) before and after, how many got 200 / 503, whether it still
answers. Client and server share the machine's cores. Writes reward_server_<timestamp>.{json,md} (benchmarks/record.py:
--results-dir, --record, --no-save).
"""
from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import logging
import os
import subprocess
import sys
import tempfile
import threading
import time

import httpx
import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
from benchmarks import record  # noqa: E402
REPLIES = ["Congratulations! That is wonderful news.", "I'm sorry to hear that. I hope tomorrow is better.",
           "Here are three tips: plan ahead, rest well, and ask for help when you need it.", "Sure."]


def cpu_name() -> str:
    out = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    name = next((line.split(":", 1)[1].strip() for line in out.splitlines() if line.startswith("Model name")), "?")
    return f"{name}, {os.cpu_count()} CPUs"


def ensure_model(kind: str, work: str) -> str:
    """The score-model directory to serve for `kind` (building a stand-in when the real one is missing)."""
    path = os.path.join(work, f"{kind}-score")
    if os.path.exists(os.path.join(path, "config.json")):
        return path
    from alignment.cpu_env import apply_cpu_defaults

    apply_cpu_defaults()  # this CPU's thread and MKL settings, before paddle is imported
    import paddle

    from alignment.models.score_model import ScoreModel

    if kind == "tiny":
        if os.path.exists(os.path.join(REPO, "outputs", "tiny-rm", "model", "config.json")):
            return os.path.join(REPO, "outputs", "tiny-rm", "model")
        from alignment.commands import make_tiny
        base = make_tiny.main(["--output", os.path.join(work, "tiny")])
    else:
        if os.path.exists(os.path.join(REPO, "outputs", "smollm2-rm", "model", "config.json")):
            return os.path.join(REPO, "outputs", "smollm2-rm", "model")
        base = os.path.join(REPO, "checkpoints", "smollm2-135m-instruct")
        if not os.path.exists(os.path.join(base, "config.json")):
            raise SystemExit(f"{base} missing: run python tools/import_gguf.py first")
    paddle.seed(11)
    ScoreModel.from_pretrained(base).save_pretrained(path, tokenizer_dir=base)
    return path


class Server:
    def __init__(self, work: str, model: str, *flags):
        self.port_file = os.path.join(work, f"port-{time.monotonic_ns()}")
        self.log = open(self.port_file + ".log", "w")
        self.proc = subprocess.Popen([sys.executable, os.path.join(REPO, "tools", "reward_server.py"), "--model", model,
                                      "--port", "0", "--port-file", self.port_file, *flags],
                                     stdout=self.log, stderr=subprocess.STDOUT, cwd=REPO)
        deadline = time.time() + 180
        while not os.path.exists(self.port_file):
            if self.proc.poll() is not None or time.time() > deadline:
                raise SystemExit(f"server did not start:\n{open(self.log.name).read()[-2000:]}")
            time.sleep(0.1)
        self.url = f"http://127.0.0.1:{int(open(self.port_file).read())}"

    def memory_kib(self) -> dict:
        with open(f"/proc/{self.proc.pid}/status") as f:
            fields = dict(line.split(":", 1) for line in f if ":" in line)
        return {key: int(fields[key].split()[0]) for key in ("VmRSS", "VmHWM")}

    def stop(self):
        self.proc.terminate()
        self.proc.wait(timeout=30)
        self.log.close()


def requests_body(i: int, prompts) -> dict:
    return {"src": [prompts[i % len(prompts)]], "response": [REPLIES[i % len(REPLIES)]]}


def drive(url: str, concurrency: int, seconds: float, prompts) -> dict:
    """`concurrency` threads posting one-row requests back to back: one warm-up request each, then at least
    `seconds` and 2 x concurrency requests; throughput = measured requests / time to the last one's answer."""
    spans, failures, lock = [], [0], threading.Lock()
    t0 = []
    barrier = threading.Barrier(concurrency, action=lambda: t0.append(time.monotonic()))

    def worker(k: int):
        with httpx.Client(timeout=600) as client:
            client.post(url + "/", json=requests_body(k, prompts))  # warm-up, not measured
            barrier.wait()
            i = k + concurrency
            while True:
                with lock:
                    if time.monotonic() > t0[0] + seconds and len(spans) >= 2 * concurrency:
                        return
                began = time.monotonic()
                ok = client.post(url + "/", json=requests_body(i, prompts)).status_code == 200
                with lock:
                    if ok:
                        spans.append((began, time.monotonic()))
                    else:
                        failures[0] += 1
                i += concurrency

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    ms = np.asarray([done - began for began, done in spans]) * 1000
    elapsed = max(done for _, done in spans) - t0[0]
    return {"concurrency": concurrency, "requests": len(spans), "failed": failures[0], "seconds": round(elapsed, 1),
            "requests_per_s": round(len(spans) / elapsed, 2), "p50_ms": round(float(np.percentile(ms, 50)), 1),
            "p99_ms": round(float(np.percentile(ms, 99)), 1)}


async def overload(url: str, requests_at_once: int, waves: int, prompts) -> dict:
    statuses = {}
    limits = httpx.Limits(max_connections=requests_at_once, max_keepalive_connections=requests_at_once)
    async with httpx.AsyncClient(timeout=300, limits=limits) as client:
        for wave in range(waves):
            answers = await asyncio.gather(*(client.post(url + "/", json=requests_body(i, prompts))
                                             for i in range(requests_at_once)), return_exceptions=True)
            for answer in answers:
                key = type(answer).__name__ if isinstance(answer, Exception) else str(answer.status_code)
                statuses[key] = statuses.get(key, 0) + 1
    return statuses


def markdown(result: dict) -> str:
    lines = [f"# Reward server load ({result['stamp']})", "", f"`python benchmarks/bench_reward_server.py "
             f"--seconds {result['seconds']}`; CPU: {result['cpu']}; one-row PaddleNLP requests; client and server "
             "on the same cores; 1-minute load average "
             f"{result['load_average_before']:.1f} before, {result['load_average_after']:.1f} after.", "",
             "| model | batching | concurrency | requests/s | p50 ms | p99 ms |", "| --- | --- | ---: | ---: | ---: | ---: |"]
    for row in result["load"]:
        lines.append(f"| {row['model']} | {row['batching']} | {row['concurrency']} | {row['requests_per_s']} | "
                     f"{row['p50_ms']} | {row['p99_ms']} |")
    o = result.get("overload")
    if o:
        lines += ["", f"Overload ({o['model']}, --max-queue {o['max_queue']}): {o['requests_at_once']} requests at "
                      f"once x {o['waves']} waves -> {o['statuses']}; peak RSS {o['peak_rss_mib_before']} MiB before, "
                      f"{o['peak_rss_mib_after']} MiB after; still answering: {o['healthy_after']}."]
    return "\n".join(lines) + "\n"


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seconds", type=float, default=5.0)
    p.add_argument("--models", default="tiny,smollm2")
    p.add_argument("--concurrency", default="1,8,32")
    p.add_argument("--max-queue", type=int, default=32)
    record.add_arguments(p)
    args = p.parse_args(argv)
    logging.getLogger("httpx").setLevel(logging.WARNING)
    prompts = [json.loads(line)["prompt"] for line in open(os.path.join(REPO, "data", "prompts", "train.jsonl"))]
    result = {"stamp": datetime.datetime.now().strftime("%Y-%m-%d %H:%M"), "cpu": cpu_name(),
              "seconds": args.seconds, "load": [], "load_average_before": os.getloadavg()[0]}
    print(f"CPU: {result['cpu']}", flush=True)
    with tempfile.TemporaryDirectory() as work:
        for kind in args.models.split(","):
            model = ensure_model(kind, work)
            for batching, flags in (("on", ["--max-batch", "32"]), ("off", ["--no-batching"])):
                server = Server(work, model, "--max-queue", "256", *flags)
                try:
                    for c in (int(x) for x in args.concurrency.split(",")):
                        row = {"model": kind, "batching": batching, **drive(server.url, c, args.seconds, prompts)}
                        result["load"].append(row)
                        print(row, flush=True)
                finally:
                    server.stop()
        kind = args.models.split(",")[-1]
        server = Server(work, ensure_model(kind, work), "--max-queue", str(args.max_queue))
        try:
            httpx.post(server.url + "/", json=requests_body(0, prompts), timeout=120)
            before = server.memory_kib()["VmHWM"]
            statuses = asyncio.run(overload(server.url, 10 * args.max_queue, 3, prompts))
            healthy = httpx.post(server.url + "/", json=requests_body(1, prompts), timeout=120).status_code == 200
            result["overload"] = {"model": kind, "max_queue": args.max_queue, "requests_at_once": 10 * args.max_queue,
                                  "waves": 3, "statuses": statuses, "peak_rss_mib_before": before // 1024,
                                  "peak_rss_mib_after": server.memory_kib()["VmHWM"] // 1024,
                                  "healthy_after": healthy}
            print(result["overload"], flush=True)
        finally:
            server.stop()
    result["load_average_after"] = os.getloadavg()[0]
    text = markdown(result)
    print(text)
    if not args.no_save:
        stamp = record.stamp()
        path = record.save("reward_server", result, record.results_dir(args), when=stamp)
        with open(path[:-len(".json")] + ".md", "w") as f:
            f.write(text)
    return result


if __name__ == "__main__":
    main()
