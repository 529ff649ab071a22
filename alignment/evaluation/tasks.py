"""Evaluation tasks: held-out rows, the reward functions that score them and, for multi-turn tasks, the
environment that plays them: the same registered reward functions and environments training uses, so a held-out
number measures what the run optimised. A task registers by NAME (EVAL_TASKS, the one registry mechanism)::

    from alignment.evaluation import EvalTask

    class Sums(EvalTask):
        NAME = "my_sums"
        reward_funcs = ("accuracy",)          # registered reward functions, as in `reward_funcs`
        def rows(self):                       # the held-out rows, as a prompt-only dataset's
            return [{"input": f"What is {a} + {b}?", "answer": str(a + b)} for a in range(5) for b in range(5)]

Give the file to `alignment-eval --task-module my_tasks.py --task my_sums` (or training's `user_eval_modules`).
A sample is correct when its reward reaches `success_threshold` (None: a graded task, mean@k only); `answer()`
extracts what maj@k votes on (`votes = False`: a task with no comparable answers, no maj@k).
"""
from __future__ import annotations

import hashlib
import json
import os
from typing import Any, ClassVar, Dict, List, Mapping, Optional, Sequence, Tuple

from alignment.config.registry import EVAL_TASKS, Registered
from alignment.rewards.rules import extract_answer

REASONING_INSTRUCTION = "Give the final number inside <answer></answer> tags."


class EvalTask(Registered, registry=EVAL_TASKS):
    reward_funcs: ClassVar[Tuple[str, ...]] = ("accuracy",)
    reward_weights: ClassVar[Optional[Tuple[float, ...]]] = None  # None: 1.0 each
    success_threshold: ClassVar[Optional[float]] = 1.0
    environment: ClassVar[Optional[str]] = None  # a registered Environment: the task is played as episodes
    environment_args: ClassVar[Dict[str, Any]] = {}
    max_turns: ClassVar[int] = 1
    max_new_tokens: ClassVar[int] = 64  # per turn
    max_episode_tokens: ClassVar[int] = 0  # tokens after the prompt per episode (0: max_new_tokens * max_turns)
    max_length: ClassVar[int] = 0  # episodes: prompt and all per row, the decode engine's width (0: measured)
    votes: ClassVar[bool] = True  # answers can be compared: maj@k (answer() extracts them)
    agent: ClassVar[Optional[str]] = None  # "file.py:function" or "module:function": an agent program plays each
    # row through the gateway (as key `agent` trains it); its return value is the sample's environment reward
    agent_timeout: ClassVar[float] = 120.0  # seconds per episode

    def rows(self) -> List[Dict[str, Any]]:
        """The held-out rows: {"input": prompt or turns, "answer": label, ...other columns an environment reads}."""
        raise NotImplementedError

    def answer(self, completion: str) -> Optional[str]:
        """What maj@k compares: the completion's answer (rules.extract_answer), a number written canonically so
        that "3", "3.0" and "03" vote together."""
        found = extract_answer(completion)
        try:
            value = float(found.replace(",", ""))
        except (AttributeError, ValueError):
            return found
        return str(int(value)) if value.is_integer() and abs(value) < 2 ** 53 else repr(value)

    def weights(self) -> Tuple[float, ...]:
        return tuple(self.reward_weights or (1.0,) * len(self.reward_funcs))

    def settings(self) -> Dict[str, Any]:
        """What a run's results depend on besides the policy: a resumed run must find the same."""
        rows = json.dumps(self.rows(), sort_keys=True, ensure_ascii=False).encode("utf-8")
        return {"task": self.NAME, "rows_sha256": hashlib.sha256(rows).hexdigest(),
                "reward_funcs": list(self.reward_funcs), "reward_weights": list(self.weights()),
                "success_threshold": self.success_threshold, "environment": self.environment,
                "environment_args": dict(self.environment_args), "max_turns": self.max_turns,
                "max_new_tokens": self.max_new_tokens, "max_episode_tokens": self.max_episode_tokens,
                "agent": self.agent}


def make_task(name: str) -> EvalTask:
    """An instance of the task registered as `name`; ValueError (one line, the registered names) otherwise."""
    return EVAL_TASKS.lookup(name)()


def reasoning_rows(task: str, size: int, seed: int, options: Mapping[str, Any]) -> List[Dict[str, Any]]:
    """reasoning-gym's procedural questions (offline, from a seed) as prompt-only rows asking for <answer> tags."""
    import reasoning_gym

    dataset = reasoning_gym.create_dataset(task, size=size, seed=seed, **dict(options))
    return [{"input": f"{entry['question']}\n{REASONING_INSTRUCTION}", "answer": str(entry["answer"]), "task": task}
            for entry in dataset]


CHECKOUT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def training_questions(paths: Sequence[str]) -> set:
    """The prompts of JSONL training files (prompt-only rows' `prompt`, alpaca rows' `instruction`); a relative
    path is the checkout's, wherever the command runs."""
    seen = set()
    for path in paths:
        with open(os.path.join(CHECKOUT, path), encoding="utf-8") as lines:
            rows = [json.loads(line) for line in lines if line.strip()]
        seen.update(row.get("prompt") or row.get("instruction") for row in rows)
    return seen


class ReasoningGymTask(EvalTask):
    """A reasoning-gym task at a fixed seed and difficulty; the seed differs from every shipped training file's.
    Questions that occur in `exclude_files` (the files a demo trains on) are skipped: the rows are the first `size`
    of the others, drawn from consecutive seeds."""
    dataset: ClassVar[str]
    options: ClassVar[Dict[str, Any]] = {}
    size: ClassVar[int] = 200
    seed: ClassVar[int] = 20261204
    exclude_files: ClassVar[Tuple[str, ...]] = ()
    max_new_tokens = 48

    def rows(self) -> List[Dict[str, Any]]:
        if not hasattr(self, "_rows"):
            seen, rows, seed = training_questions(self.exclude_files), [], self.seed
            while len(rows) < self.size:  # reasoning-gym draws item i of a seed from seed + i
                rows += [row for row in reasoning_rows(self.dataset, self.size, seed, self.options)
                         if row["input"] not in seen]
                seed += self.size
            self._rows = rows[:self.size]
        return self._rows


# sized for a 135M model: two terms of 1-2 digits, + and - (the shipped data/reasoning files' difficulty)
BASIC_ARITHMETIC = dict(min_terms=2, max_terms=2, min_digits=1, max_digits=2, operators=("+", "-"),
                        allow_parentheses=False, allow_negation=False)


class BasicArithmetic(ReasoningGymTask):
    NAME = "basic_arithmetic"
    dataset, options = "basic_arithmetic", BASIC_ARITHMETIC


class ChainSum(ReasoningGymTask):
    NAME = "chain_sum"
    dataset, options = "chain_sum", dict(min_terms=3, max_terms=3, min_digits=1, max_digits=1)
    exclude_files = ("data/chain_sum/chain_sum_train.jsonl", "data/chain_sum/chain_sum_worked.jsonl")


class LegCounting(ReasoningGymTask):
    NAME = "leg_counting"
    dataset, options = "leg_counting", dict(min_animals=1, max_animals=2, max_instances=2)


class ToolArithmetic(EvalTask):
    """The tool demo's held-out questions, played with the calculator tool as the tool demo trains."""
    NAME = "tool_arithmetic"
    environment = "tools"
    environment_args = {"tools": ["calculator"], "format": "hermes-compact"}
    max_turns, max_new_tokens, max_episode_tokens, max_length = 3, 48, 112, 256  # the tool demo's
    path: ClassVar[str] = "data/tool_arithmetic/heldout.jsonl"

    def rows(self) -> List[Dict[str, Any]]:
        from alignment.evaluation.rows import dataset_rows

        return dataset_rows(f"prompt-only:1.0:{self.path}")


class DialogueGold(EvalTask):
    """The quickstart's held-out prompts under its gold judge (graded: mean@k, no pass@k)."""
    NAME = "dialogue_gold"
    reward_funcs = ("combined",)
    success_threshold, votes = None, False
    max_new_tokens = 32
    path: ClassVar[str] = "data/prompts/eval.jsonl"

    def rows(self) -> List[Dict[str, Any]]:
        from alignment.evaluation.rows import dataset_rows

        return dataset_rows(f"prompt-only:1.0:{self.path}")


class SpecTask(EvalTask):
    """A task from a dataset spec and reward functions (not registered: built per run)."""

    def __init__(self, spec: str, reward_funcs: Sequence[str], reward_weights: Optional[Sequence[float]] = None,
                 success_threshold: Optional[float] = 1.0, environment: Optional[str] = None,
                 environment_args: Optional[Dict[str, Any]] = None, max_turns: int = 1, max_new_tokens: int = 64,
                 max_episode_tokens: int = 0, agent: Optional[str] = None, max_length: int = 0):
        self.NAME = f"dataset:{spec}"
        self.spec = spec
        self.reward_funcs, self.reward_weights = tuple(reward_funcs), \
            tuple(reward_weights) if reward_weights else None
        self.success_threshold, self.environment = success_threshold, environment
        self.environment_args, self.max_turns = dict(environment_args or {}), max_turns
        self.max_new_tokens, self.max_episode_tokens = max_new_tokens, max_episode_tokens
        self.agent, self.max_length = agent, max_length
        from alignment.evaluation.rows import dataset_rows

        self._rows = dataset_rows(spec)

    def rows(self) -> List[Dict[str, Any]]:
        return self._rows


def task_names() -> Sequence[str]:
    return EVAL_TASKS.names()
