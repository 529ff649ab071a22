"""Evaluate a policy on held-out tasks: pass@k, maj@k and mean@k with bootstrap 95% confidence intervals.

    alignment-eval --model outputs/smollm2-grpo/model --task basic_arithmetic --n 8 --output-dir eval/grpo
    alignment-eval --endpoint http://127.0.0.1:8000/v1 --task basic_arithmetic --output-dir eval/served
    alignment-eval --model DIR --dataset prompt-only:1.0:my.jsonl --reward-funcs accuracy --output-dir eval/mine
    alignment-eval --model DIR --dataset prompt-only:1.0:my.jsonl --reward-funcs "" --agent my_agent.py:play
    alignment-eval --compare eval/sft/basic_arithmetic eval/grpo/basic_arithmetic

The policy is a checkpoint (a stage's output directory, its model/ or an export's hf/), decoded by the decode
engine in batches, or an OpenAI-compatible chat endpoint. A task is a registered evaluation task (--list-tasks; your
own with --task-module FILE) or a dataset spec scored by registered reward functions, played in an environment
or by an agent program (an OpenAI-client function, its return value the reward) when one is given. Each task
writes OUTPUT_DIR/TASK/: items.jsonl (every sample: completion, rewards, seed), run.json (the settings) and
summary.json / summary.md (CPU, date, commit, command). A rerun of the same command goes on where an interrupted
run stopped and finishes with the same results. --compare A B prints B - A per metric with a paired bootstrap 95% CI
over the items both evaluated.
"""
from __future__ import annotations

import json
import os
import sys

from alignment.commands.tool_parser import ToolParser, non_negative_int, non_negative_number, positive_int, \
    probability
from alignment.evaluation.tasks import EvalTask, SpecTask, make_task, task_names
from alignment.inputs import InputError


def parser() -> ToolParser:
    p = ToolParser(__doc__)
    policy = p.add_mutually_exclusive_group()
    policy.add_argument("--model", help="checkpoint directory (a stage's output, its model/, or an export)")
    policy.add_argument("--endpoint", help="base URL of an OpenAI-compatible API (…/v1)")
    p.add_argument("--endpoint-model", default="", help="the `model` field of requests to --endpoint")
    p.add_argument("--endpoint-api-key", default=os.environ.get("OPENAI_API_KEY", "none"),
                   help="the bearer key of --endpoint (default: $OPENAI_API_KEY)")
    p.add_argument("--task", action="append", default=[], help="a registered task; repeat for several")
    p.add_argument("--task-module", action="append", default=[], help="a .py file or module registering tasks")
    p.add_argument("--dataset", help="a dataset spec (name:proportion:path) to evaluate instead of a task")
    p.add_argument("--reward-funcs", default="accuracy", help="with --dataset: comma-separated reward functions")
    p.add_argument("--success-threshold", type=float, default=1.0,
                   help="with --dataset: a sample with reward >= this is correct")
    p.add_argument("--environment", help="with --dataset: a registered environment to play the rows in")
    p.add_argument("--max-turns", type=positive_int, default=1, help="with --environment")
    p.add_argument("--agent", help="with --dataset: an agent program (FILE.py:FUNCTION or module:function) playing "
                                   "each row through the gateway, as key `agent` trains it")
    p.add_argument("--max-length", type=non_negative_int, default=0,
                   help="with --agent: tokens per episode, the decode engine's width (0: 512)")
    p.add_argument("--n", type=positive_int, default=1, help="samples per item (k up to n)")
    p.add_argument("--temperature", type=non_negative_number, default=None,
                   help="0 = greedy; default: greedy for --n 1, else 1.0")
    p.add_argument("--top-p", type=probability, default=1.0)
    p.add_argument("--max-new-tokens", type=non_negative_int, default=0, help="per turn (0: the task's)")
    p.add_argument("--seed", type=non_negative_int, default=0)
    p.add_argument("--batch-size", type=positive_int, default=32, help="sequences decoded together")
    p.add_argument("--limit", type=non_negative_int, default=0, help="the first N items only (0: all)")
    p.add_argument("--output-dir", help="where each task's results go (OUTPUT_DIR/TASK/); resumable")
    p.add_argument("--compare", nargs=2, metavar=("A", "B"), help="two evaluation directories: B - A")
    p.add_argument("--list-tasks", action="store_true")
    return p


def tasks_from(args) -> list:
    from alignment.data.user_modules import import_user_module

    for module in args.task_module:
        import_user_module(module)
    if args.dataset:
        funcs = [f.strip() for f in args.reward_funcs.split(",") if f.strip()]
        return [SpecTask(args.dataset, funcs, success_threshold=args.success_threshold,
                         environment=args.environment, max_turns=args.max_turns,
                         max_new_tokens=args.max_new_tokens or EvalTask.max_new_tokens, agent=args.agent,
                         max_length=args.max_length)]
    if not args.task:
        raise InputError("give --task NAME (see --list-tasks) or --dataset SPEC")
    return [make_task(name) for name in args.task]


def policy_from(args):
    if args.endpoint:
        from alignment.evaluation.endpoint import EndpointPolicy

        policy = EndpointPolicy(args.endpoint, args.endpoint_model, args.endpoint_api_key)
        policy.check()
        return policy
    if not args.model:
        raise InputError("give --model DIR or --endpoint URL")
    from alignment.evaluation.policies import LocalPolicy

    return LocalPolicy(args.model)


def task_dir(output_dir, task) -> str:
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in task.NAME)
    return os.path.join(output_dir, safe)


def main(argv=None):
    args = parser().parse_args(argv)
    if args.list_tasks:
        print("\n".join(task_names()))
        return task_names()
    if args.compare:
        from alignment.evaluation.report import compare

        result = compare(*args.compare, seed=args.seed)
        print(f"B - A over {result['items']} items (paired bootstrap, 95% CI):")
        for name, v in result["difference"].items():
            print(f"  {name:10s} {v['mean']:+.4f}  [{v['low']:+.4f}, {v['high']:+.4f}]")
        return result
    from alignment.evaluation.report import table, write_summary
    from alignment.evaluation.runner import EvalSettings, evaluate

    settings = EvalSettings(n=args.n, temperature=args.temperature, top_p=args.top_p, seed=args.seed,
                            batch_size=args.batch_size, limit=args.limit, max_new_tokens=args.max_new_tokens)
    tasks = tasks_from(args)
    policy = policy_from(args)
    results = {}
    for task in tasks:
        out = task_dir(args.output_dir, task) if args.output_dir else None
        result = evaluate(policy, task, settings, out, progress=lambda done, total: print(
            f"{task.NAME}: {done}/{total} items", file=sys.stderr, flush=True))
        if out:
            write_summary(out, result)
        print(f"## {task.NAME}\n{table(result['summary'])}\n")
        results[task.NAME] = result["summary"]
    if not args.output_dir:
        print(json.dumps(results))
    return results
