"""Play a few episodes of an environment with a random policy and report what would fail in training.

    alignment-check-env SPEC --rows FILE [--env-args JSON] [--env-modules FILE ...] [--episodes 4] [--max-turns 4]

SPEC names the environment as an argument file does: a registered name ("tools", "gem", "textarena", a user
environment's NAME with --env-modules), 'module:Class' / 'file.py:Class', or an argument file (.json / .yaml)
whose environment, environment_args, user_env_modules and max_turns are used. --rows: the dataset (a file or a
spec such as "prompt-only:1.0:rows.jsonl"), each row given to reset as in a run. The random policy writes random
text, and well-formed random tool calls when the environment shows tools. Each episode is played twice with one
seed: a different second play is reported as not deterministic (timing metrics such as tool_time, which measure
wall-clock time, are not compared). What the run would stop on (a raise, a wrong
type: the run's own one-line errors) exits 2; slow resets or steps (--slow seconds) and nondeterminism are
warnings.
"""
from __future__ import annotations

import json
import os
import random
import statistics
import string
import time
from typing import Any, Dict, List, Mapping, Optional, Tuple

from alignment.config.argument_file import load_argument_file
from alignment.data import MixedRawDataset
from alignment.envs import (TIMING_METRICS, Environment, EnvironmentFailure, ToolEnvironment, checked_reset,
                            checked_step, load_environment_modules)
from alignment.envs.base import checked_stop_strings
from alignment.envs.formats import ToolCallFormat
from alignment.envs.routed import environment_factory
from alignment.commands.tool_parser import ToolParser

WORDS = ("the", "answer", "is", "move", "[0]", "[4]", "yes", "no", "7", "42", "\\boxed{3}", "####", "call", "x")


def main(argv=None) -> Dict[str, Any]:
    parser = ToolParser(__doc__)
    parser.add_argument("spec")
    parser.add_argument("--rows", required=True)
    parser.add_argument("--env-args", default=None, help="environment_args as JSON")
    parser.add_argument("--env-modules", nargs="*", default=None)
    parser.add_argument("--episodes", type=int, default=4)
    parser.add_argument("--max-turns", type=int, default=None)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--slow", type=float, default=1.0, help="seconds above which a reset or step is slow")
    args = parser.parse_args(argv)
    spec, env_args, modules, max_turns, base_dir = resolve_spec(args)
    load_environment_modules(modules, base_dir)
    build = environment_factory(spec, env_args, "environment")
    rows = load_rows(args.rows, args.episodes)
    report = {"episodes": [], "warnings": []}
    for index, row in enumerate(rows):
        first = play(build, row, max_turns, args.seed + index)
        second = play(build, row, max_turns, args.seed + index)
        first["row"] = index
        report["episodes"].append(first)
        print(describe(first))
        played, replayed = without_timing(first["transcript"]), without_timing(second["transcript"])
        if played != replayed:
            report["warnings"].append(f"row {index}: not deterministic under one seed: a second play "
                                      f"{first_difference(played, replayed)}")
    times = [t for e in report["episodes"] for t in e["step_seconds"]]
    resets = [e["reset_seconds"] for e in report["episodes"]]
    for what, values in (("reset", resets), ("step", times)):
        if values and max(values) > args.slow:
            report["warnings"].append(f"slow {what}: {max(values):.2f} s (more than --slow {args.slow:g} s); a "
                                      f"batch waits for it each turn unless the environment is async")
    for warning in report["warnings"]:
        print(f"warning: {warning}")
    print(f"ok: {len(rows)} episodes, reset {milliseconds(resets)}, step {milliseconds(times)}")
    return report


def resolve_spec(args) -> Tuple[str, Dict[str, Any], List[str], int, Optional[str]]:
    """(spec, environment_args, user_env_modules, max_turns, base_dir) from the command line or argument file."""
    env_args = json.loads(args.env_args) if args.env_args else {}
    if not isinstance(env_args, dict):
        raise ValueError(f"--env-args must be a JSON object, got {args.env_args!r}")
    spec, modules, max_turns, base_dir = args.spec, list(args.env_modules or []), 4, None
    if spec.endswith((".json", ".yaml", ".yml")) and os.path.isfile(spec):
        values = load_argument_file(spec)
        if not values.get("environment"):
            raise ValueError(f"{spec}: key 'environment' is not set (a single-turn run has no environment)")
        spec, base_dir = values["environment"], os.path.dirname(os.path.abspath(args.spec))
        env_args = {**(values.get("environment_args") or {}), **env_args}
        modules += list(values.get("user_env_modules") or [])
        max_turns = int(values.get("max_turns") or max_turns)
    return spec, env_args, modules, args.max_turns or max_turns, base_dir


def load_rows(spec: str, count: int) -> List[Dict[str, Any]]:
    """The first `count` rows of a dataset, each as a run's environment gets it (its columns, input, answer)."""
    dataset = MixedRawDataset(spec if ":" in spec and not os.path.exists(spec) else f"prompt-only:1.0:{spec}")
    rows = []
    for i in range(min(count, len(dataset))):
        sample = dict(dataset[i])
        rows.append({**sample.pop("columns", {}), **sample})  # as ppo/rollout/episodes.py: environment_row
    if not rows:
        raise ValueError(f"--rows {spec}: no rows")
    return rows


def play(build, row: Mapping[str, Any], max_turns: int, seed: int) -> Dict[str, Any]:
    """One episode with the random policy: its transcript, rewards, timings; an EnvironmentFailure as the run's
    one-line error (a ValueError: exit 2)."""
    rng = random.Random(seed)
    env = build()
    try:
        start = time.perf_counter()
        messages = checked_reset(env, row)
        reset_seconds = time.perf_counter() - start
        checked_stop_strings(env)
        transcript, rewards, step_seconds, done = [messages], [], [], False
        while not done and len(rewards) < max_turns:
            action = random_turn(env, rng)
            start = time.perf_counter()
            result = checked_step(env, action)
            step_seconds.append(time.perf_counter() - start)
            transcript.append([action, result.observation, result.reward, result.done, result.metrics])
            rewards.append(result.reward)
            done = result.done
    except EnvironmentFailure as err:
        raise ValueError(str(err)) from None
    return {"transcript": json.loads(json.dumps(transcript, default=str)), "rewards": rewards, "done": done,
            "reset_seconds": reset_seconds, "step_seconds": step_seconds, "name": env.env_name}


def random_turn(env: Environment, rng: random.Random) -> str:
    """Random words, or (half the time, when the environment shows tools) a well-formed call of a random tool
    with random arguments of the schema's types."""
    schemas, format = shown_tools(env)
    if schemas and rng.random() < 0.5:
        function = rng.choice(schemas)["function"]
        properties = function.get("parameters", {}).get("properties", {})
        return format.format_call(function["name"], {name: random_value(prop, rng)
                                                     for name, prop in properties.items()})
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 8)))


def shown_tools(env: Environment) -> Tuple[List[Dict[str, Any]], Optional[ToolCallFormat]]:
    env = getattr(env, "current", None) or env  # a routed environment: the one playing
    if isinstance(env, ToolEnvironment):
        return [tool.schema for tool in env.active.values()], env.format
    schemas, format = getattr(env, "tool_schemas", None), getattr(env, "format", None)
    return (list(schemas), format) if schemas and isinstance(format, ToolCallFormat) else ([], None)


def random_value(prop: Mapping[str, Any], rng: random.Random) -> Any:
    if "enum" in prop:
        return rng.choice(prop["enum"])
    kind = prop.get("type")
    if kind == "integer":
        return rng.randint(-20, 20)
    if kind == "number":
        return round(rng.uniform(-20, 20), 3)
    if kind == "boolean":
        return rng.random() < 0.5
    if kind == "array":
        return [random_value(prop.get("items", {"type": "string"}), rng) for _ in range(rng.randint(0, 3))]
    if kind == "object":
        return {}
    return "".join(rng.choice(string.ascii_letters + string.digits + " +-*/") for _ in range(rng.randint(1, 12)))


def without_timing(transcript: List[Any]) -> List[Any]:
    """The transcript with each turn's timing metrics (TIMING_METRICS) left out: what must repeat under one seed."""
    return [transcript[0]] + [turn[:4] + [{k: v for k, v in turn[4].items() if k not in TIMING_METRICS}]
                              for turn in transcript[1:]]


def first_difference(first: List[Any], second: List[Any]) -> str:
    if first[0] != second[0]:
        return "had different first messages"
    for turn, (a, b) in enumerate(zip(first[1:], second[1:]), start=1):
        if a != b:
            return f"differed at turn {turn} ({'observation' if a[1] != b[1] else 'reward, done or metrics'})"
    return f"lasted {len(second) - 1} turns instead of {len(first) - 1}"


def describe(episode: Dict[str, Any]) -> str:
    ending = "done" if episode["done"] else "still going at --max-turns"
    return (f"row {episode['row']}: {episode['name']}, {len(episode['rewards'])} turns ({ending}), reward "
            f"{sum(episode['rewards']):g}, reset {episode['reset_seconds'] * 1e3:.1f} ms, step "
            f"{milliseconds(episode['step_seconds'])}")


def milliseconds(values: List[float]) -> str:
    if not values:
        return "-"
    return f"mean {statistics.mean(values) * 1e3:.1f} ms, max {max(values) * 1e3:.1f} ms"
