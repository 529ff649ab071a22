"""Arithmetic where the calculator matters: questions with 3-5 digit operands, and the SFT traces of both arms.

    python examples/tool_arithmetic/make_data.py --output data/tool_arithmetic \
        [--tokenizer checkpoints/smollm2-135m-instruct] [--seed 0] [--sft 400 --train 400 --heldout 100]

Writes (the same seed gives byte-identical files; the four question sets never share a question):
  train.jsonl, heldout.jsonl   RL prompts and the held-out test: {"input": question, "answer": "<integer>"}
  sft_tools.jsonl              tool-use traces: {"messages": [system, user, assistant tool call, tool, assistant]},
                               played through the "tools" environment (its system prompt, the calculator's real
                               result), so they are what a rollout shows the policy
  sft_direct.jsonl             the no-tool arm's traces of the same questions: {"input", "answer"}
Both arms end with the same sentence, "The answer is N.". With --tokenizer, every tool trace is checked to
tokenise for SFT exactly as a rollout lays it out (alignment/envs/traces.py: check_trace).
"""
from __future__ import annotations

import argparse
import json
import os
import random
import sys
from typing import Callable, Dict, List, Tuple

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from alignment.envs import ToolEnvironment, calculator  # noqa: E402
from alignment.envs.traces import check_trace, scripted_episode  # noqa: E402

ENVIRONMENT_ARGS = {"tools": ["calculator"], "format": "hermes-compact"}  # as config/smollm2/grpo_tools_argument


def digits(rng: random.Random, low: int = 3, high: int = 5) -> int:
    """A number of `low`-`high` digits (the digit count drawn first, so 3-digit numbers are as common as 5)."""
    n = rng.randint(low, high)
    return rng.randint(10 ** (n - 1), 10 ** n - 1)


def _product(rng):
    a, b = digits(rng), digits(rng, 3, 4)
    return rng.choice(["What is {a} * {b}?", "Compute {a} * {b}.", "Calculate {a} times {b}."]), (a, b), "{a} * {b}"


def _sum_product(rng):
    a, b, c = digits(rng, 3, 4), digits(rng, 3, 4), digits(rng)
    return rng.choice(["What is {a} * {b} + {c}?", "Compute {c} + {a} * {b}."]), (a, b, c), "{a} * {b} + {c}"


def _scaled_sum(rng):
    a, b, c = digits(rng), digits(rng), digits(rng, 3, 3)
    return "What is ({a} + {b}) * {c}?", (a, b, c), "({a} + {b}) * {c}"


def _sum_difference(rng):
    a, b, c = digits(rng, 4, 5), digits(rng), digits(rng)
    return "Calculate {a} + {b} - {c}.", (a, b, c), "{a} + {b} - {c}"


def _boxes(rng):
    a, b = digits(rng, 3, 4), digits(rng, 3, 4)
    return ("A warehouse has {a} boxes with {b} screws in each box. How many screws are there?", (a, b),
            "{a} * {b}")


def _coins(rng):
    a, b = digits(rng, 4, 5), digits(rng)
    c = rng.randint(100, min(99999, a + b - 1))  # she never spends more than she has
    return ("Sara had {a} coins. She earned {b} more and then spent {c}. How many coins does she have now?",
            (a, b, c), "{a} + {b} - {c}")


def _packs(rng):
    a, b, c = digits(rng, 3, 4), digits(rng, 3, 3), digits(rng)
    return ("A school buys {a} packs of {b} pencils and {c} loose pencils. How many pencils is that?", (a, b, c),
            "{a} * {b} + {c}")


FAMILIES: List[Callable[[random.Random], Tuple[str, tuple, str]]] = [
    _product, _sum_product, _scaled_sum, _sum_difference, _boxes, _coins, _packs]


def make_problem(rng: random.Random) -> Dict[str, str]:
    """{"input": question, "answer": the integer as text, "expression": what the calculator is asked}."""
    question, numbers, expression = rng.choice(FAMILIES)(rng)
    names = dict(zip("abc", numbers))
    expression = expression.format(**names)
    return {"input": question.format(**names), "answer": calculator(expression), "expression": expression}


def make_problems(seed: int, sizes: Dict[str, int]) -> Dict[str, List[Dict[str, str]]]:
    """Disjoint sets of problems, drawn in the order of `sizes` from one seeded generator."""
    rng, seen, out = random.Random(seed), set(), {}
    for name, size in sizes.items():
        out[name] = []
        while len(out[name]) < size:
            problem = make_problem(rng)
            if problem["input"] not in seen:
                seen.add(problem["input"])
                out[name].append(problem)
    return out


def final_text(answer: str) -> str:
    return f"The answer is {answer}."


def tool_trace(env: ToolEnvironment, problem: Dict[str, str]) -> List[Dict[str, str]]:
    """The tool arm's trace: one calculator call with the problem's expression, then the answer it returned."""
    call = env.format.format_call("calculator", {"expression": problem["expression"]})
    messages = scripted_episode(env, {"input": problem["input"]}, [call, final_text(problem["answer"])])
    if messages[-2] != {"role": "tool", "content": problem["answer"]}:
        raise ValueError(f"the calculator answered {messages[-2]['content']!r} to {problem['expression']!r}, "
                         f"expected {problem['answer']!r}")
    return messages


def write_jsonl(path: str, rows: List[dict]) -> None:
    with open(path, "w", encoding="utf-8") as f:
        f.writelines(json.dumps(row, ensure_ascii=False) + "\n" for row in rows)


def main(argv=None) -> Dict[str, int]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--output", default="data/tool_arithmetic")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--sft", type=int, default=400, help="SFT traces per arm")
    parser.add_argument("--train", type=int, default=400, help="RL prompts")
    parser.add_argument("--heldout", type=int, default=100, help="held-out test questions")
    parser.add_argument("--tokenizer", default=None, help="check every tool trace against this tokenizer")
    args = parser.parse_args(argv)
    if min(args.sft, args.train, args.heldout) < 1:
        parser.error("--sft, --train and --heldout must be >= 1")
    problems = make_problems(args.seed, {"sft": args.sft, "train": args.train, "heldout": args.heldout})
    env = ToolEnvironment(**ENVIRONMENT_ARGS)
    traces = [{"messages": tool_trace(env, problem)} for problem in problems["sft"]]
    if args.tokenizer:
        from alignment.models import Tokenizer
        tokenizer = Tokenizer.from_pretrained(args.tokenizer)
        for trace in traces:
            check_trace(tokenizer, trace["messages"], env.stop_strings)
    os.makedirs(args.output, exist_ok=True)
    write_jsonl(os.path.join(args.output, "sft_tools.jsonl"), traces)
    write_jsonl(os.path.join(args.output, "sft_direct.jsonl"),
                [{"input": p["input"], "answer": final_text(p["answer"])} for p in problems["sft"]])
    for name in ("train", "heldout"):
        write_jsonl(os.path.join(args.output, f"{name}.jsonl"),
                    [{"input": p["input"], "answer": p["answer"]} for p in problems[name]])
    counts = {name: len(rows) for name, rows in problems.items()}
    checked = f", every tool trace checked against {args.tokenizer}" if args.tokenizer else ""
    print(f"{args.output}: {counts['sft']} SFT traces per arm, {counts['train']} RL prompts, {counts['heldout']} "
          f"held-out questions (seed {args.seed}){checked}")
    return counts


if __name__ == "__main__":
    main()
