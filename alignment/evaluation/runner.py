"""One evaluation: a policy's n samples per held-out item of a task, scored by the task's reward functions (and
its environment's rewards for episodes), written item by item to `items.jsonl`, then summarised with bootstrap
confidence intervals (summary.json / summary.md).

Items go in fixed batches (batch b holds items [b * m, (b + 1) * m)); a batch's records are appended whole after it
is scored. A rerun with the same settings reads the finished batches and goes on from the first missing one; since
each sample has its own seed and every batch is decoded as in an uninterrupted run, the finished run is the same.
"""
from __future__ import annotations

import dataclasses
import json
import os
import sys
from typing import Any, Callable, Dict, List, Optional

from alignment.fileio import write_json_atomic, write_text_atomic
from alignment.evaluation.metrics import item_metrics, ks_up_to, summarize
from alignment.evaluation.policies import sample_seed
from alignment.evaluation.tasks import EvalTask
from alignment.inputs import InputError

ITEMS, SETTINGS = "items.jsonl", "run.json"
MAY_CHANGE = ("endpoint",)  # where a policy is served may change between a run and its resumption; what is may not


@dataclasses.dataclass(frozen=True)
class EvalSettings:
    n: int = 1  # samples per item; pass@k / maj@k / mean@k for k up to n
    temperature: Optional[float] = None  # None: greedy for n == 1, else 1.0
    top_p: float = 1.0
    seed: int = 0
    batch_size: int = 32  # sequences decoded together (items per batch: batch_size // n, at least 1)
    limit: int = 0  # evaluate the first `limit` items (0: all)
    max_new_tokens: int = 0  # 0: the task's

    def __post_init__(self):
        if self.n < 1 or self.batch_size < 1 or self.limit < 0 or self.max_new_tokens < 0:
            raise InputError(f"n and batch_size must be >= 1, limit and max_new_tokens >= 0; got n={self.n}, "
                             f"batch_size={self.batch_size}, limit={self.limit}, "
                             f"max_new_tokens={self.max_new_tokens}")
        if self.temperature is None:
            object.__setattr__(self, "temperature", 0.0 if self.n == 1 else 1.0)
        if self.temperature < 0 or (self.temperature == 0 and self.n > 1):
            raise InputError(f"temperature {self.temperature}: greedy decoding (0) gives one sample per item "
                             f"(n=1); sample with a temperature > 0 for n={self.n}")

    @property
    def items_per_batch(self) -> int:
        return max(1, self.batch_size // self.n)


AGENT_LENGTH = 512  # tokens per agent episode (prompts, tool results and replies) unless the task sets max_length


def run_settings(policy, task: EvalTask, settings: EvalSettings) -> Dict[str, Any]:
    return {**task.settings(), **dataclasses.asdict(settings), **policy.describe()}


def read_finished(out_dir: str, expected: Dict[str, Any]) -> List[Dict[str, Any]]:
    """The records of a finished part of the same run in out_dir ([] when it holds none); a run with other
    settings there is an InputError naming the first setting that differs."""
    path = os.path.join(out_dir, SETTINGS)
    if not os.path.exists(path):
        return []
    with open(path, encoding="utf-8") as f:
        found = json.load(f)
    for key, value in expected.items():
        if found.get(key) != value and key not in MAY_CHANGE:
            raise InputError(f"{path}: this directory holds an evaluation with {key} = {found.get(key)!r}, not "
                             f"{value!r}; give another --output-dir (or remove it)")
    records = []
    if os.path.exists(os.path.join(out_dir, ITEMS)):
        with open(os.path.join(out_dir, ITEMS), encoding="utf-8") as f:
            for line in f:
                if not line.endswith("\n"):
                    break  # a batch cut by a kill mid-write: its items are evaluated again
                records.append(json.loads(line))
    return records


def score_samples(task: EvalTask, prompts, completions, answers, env_rewards=None) -> List[Dict[str, float]]:
    """Each sample's reward (the weighted reward functions plus its environment's) and the functions' scores."""
    from alignment.rewards.functions import function_scores, load_reward_function

    funcs = [(spec, load_reward_function(spec)) for spec in task.reward_funcs]
    scores = function_scores(funcs, prompts, completions, {"answer": answers}) if funcs else {}
    out = []
    for i in range(len(completions)):
        parts = {spec: float(values[i]) for spec, values in scores.items()}
        reward = sum(w * parts[spec] for spec, w in zip(task.reward_funcs, task.weights()))
        if env_rewards is not None:
            parts["environment"] = float(env_rewards[i])
            reward += env_rewards[i]
        out.append({"reward": float(reward), "rewards": parts})
    return out


def sample_batch(policy, task: EvalTask, settings: EvalSettings, rows, indices, capacity: int) -> List[Dict]:
    """Every sample of the items `indices`: completion, tokens, reward and correctness, in item order."""
    max_new = settings.max_new_tokens or task.max_new_tokens
    config = policy.generation_config(max_new, settings.temperature, settings.top_p)
    slots = settings.items_per_batch * settings.n
    pairs = [(i, j) for i in indices for j in range(settings.n)]
    seeds = [sample_seed(settings.seed, i, j) for i, j in pairs]
    sample_rows = [rows[i] for i, _ in pairs]
    errors = [None] * len(pairs)
    if task.agent is not None:
        completions, tokens, env_rewards, errors = map(list, zip(*policy.agent_episodes(task, sample_rows, seeds,
                                                                                       config, capacity)))
        report_agent_errors(task, errors)
    elif task.environment is None:
        outputs = policy.complete(sample_rows, seeds, config, capacity, slots)
        completions, tokens, env_rewards = [t for t, _ in outputs], [n for _, n in outputs], None
    else:
        outputs = policy.episodes(task, sample_rows, seeds, config, capacity)
        completions, tokens, env_rewards = [o[0] for o in outputs], [o[1] for o in outputs], [o[2] for o in outputs]
    scored = score_samples(task, [rows[i]["input"] for i, _ in pairs], completions,
                           [rows[i].get("answer") for i, _ in pairs], env_rewards)
    samples = []
    for (i, j), seed, text, n_tokens, score, error in zip(pairs, seeds, completions, tokens, scored, errors):
        correct = None if task.success_threshold is None else bool(score["reward"] >= task.success_threshold)
        samples.append({"seed": seed, "completion": text, "tokens": n_tokens, **score, "correct": correct,
                        "answer": task.answer(text) if task.votes else None,
                        **({"agent_error": error} if task.agent is not None else {})})
    return samples


def report_agent_errors(task: EvalTask, errors: List[Optional[str]]) -> None:
    """A batch's failed agent episodes (scored 0 for the agent, kept in items.jsonl as agent_error), in one line."""
    failed = [e for e in errors if e is not None]
    if failed:
        print(f"agent {task.agent!r}: {len(failed)} of {len(errors)} episodes of the batch failed; the first: "
              f"{failed[0]}", file=sys.stderr, flush=True)


def item_record(index: int, row: Dict[str, Any], samples: List[Dict], task: EvalTask, n: int) -> Dict[str, Any]:
    correct = None if task.success_threshold is None else [s["correct"] for s in samples]
    voted = [s["answer"] for s in samples] if task.votes and correct is not None else None
    return {"index": index, "prompt": row["input"], "label": row.get("answer"), "samples": samples,
            "metrics": item_metrics([s["reward"] for s in samples], correct, voted, ks_up_to(n))}


def evaluate(policy, task: EvalTask, settings: EvalSettings, out_dir: Optional[str] = None,
             progress: Callable[[int, int], None] = lambda done, total: None) -> Dict[str, Any]:
    """Evaluate `policy` on `task`; with out_dir, resume what it holds and write items.jsonl, summary.{json,md}.
    Returns {"settings", "items": per-item records, "summary": {metric: {mean, low, high}}}."""
    rows = task.rows()[: settings.limit or None]
    if not rows:
        raise InputError(f"task {task.NAME!r} has no items")
    for index, row in enumerate(rows):
        prompt = row.get("input") if isinstance(row, dict) else None
        if not (isinstance(prompt, str) or isinstance(prompt, list) and prompt and all(isinstance(turn, str)
                                                                                        for turn in prompt)):
            raise InputError(f"task {task.NAME!r} row {index}: no 'input' (a prompt, or a list of turns ending with "
                             f"the user's); the row holds {sorted(row) if isinstance(row, dict) else row!r}")
    expected = run_settings(policy, task, settings)
    done: List[Dict[str, Any]] = []
    if out_dir is not None:
        os.makedirs(out_dir, exist_ok=True)
        done = read_finished(out_dir, expected)
        done = done[: len(done) // settings.items_per_batch * settings.items_per_batch]  # whole batches only
        write_json_atomic(os.path.join(out_dir, SETTINGS), expected)
        write_text_atomic(os.path.join(out_dir, ITEMS), "".join(json.dumps(r, ensure_ascii=False) + "\n"
                                                                for r in done))  # without a batch cut mid-write
    capacity = policy_capacity(policy, task, settings, rows)
    records, m = list(done), settings.items_per_batch
    for start in range(len(done), len(rows), m):
        indices = list(range(start, min(start + m, len(rows))))
        samples = sample_batch(policy, task, settings, rows, indices, capacity)
        batch = [item_record(i, rows[i], samples[k * settings.n:(k + 1) * settings.n], task, settings.n)
                 for k, i in enumerate(indices)]
        if out_dir is not None:
            with open(os.path.join(out_dir, ITEMS), "a", encoding="utf-8") as f:
                f.write("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in batch))
                f.flush()
                os.fsync(f.fileno())
        records += batch
        progress(len(records), len(rows))
    return {"settings": expected, "items": records, "summary": summarize([r["metrics"] for r in records],
                                                                         settings.seed)}


def policy_capacity(policy, task: EvalTask, settings: EvalSettings, rows) -> int:
    """The decode engine's width for every batch of the run (the same for a resumed run and inline). An agent
    writes its own prompts: its width is the task's max_length (default AGENT_LENGTH)."""
    if task.agent is not None:
        return task.max_length or AGENT_LENGTH
    if task.environment is not None and task.max_length:
        return task.max_length
    budget = task.max_episode_tokens or (settings.max_new_tokens or task.max_new_tokens) * task.max_turns
    return policy.capacity(task, rows, budget)
