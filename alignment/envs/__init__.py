"""Environments and tools for multi-turn rollouts.

Environments (alignment/envs/base.py): subclass `Environment` with a `NAME` to register it; one instance runs one
episode. `reset(row)` returns the first chat messages ({"role", "content"} dicts) for a dataset row;
`step(text)` gets the assistant's turn and returns `StepResult(observation, reward, done, metrics)`.
`make_environment(name, **kwargs)` builds a registered one; `load_environment_modules(paths, base_dir)` imports
the files or modules of `user_env_modules` so theirs register. What a user environment returns is checked
(`checked_reset`, `checked_step`): a raise or a wrong type is an `EnvironmentFailure` naming the environment.

Tools (tools.py, formats.py): plain functions with type hints and a Google-style docstring; `tool_schema(fn)` is
their OpenAI function-calling schema. A `ToolCallFormat` (registry; "hermes" = `<tool_call>{json}</tool_call>`,
the default) shows tools to the policy and parses its calls. `run_tool_call` never raises: an unknown tool, a call
that does not parse, bad arguments, a raise or a timeout is an "Error: ..." text the policy reads.
Built in: `calculator` (arithmetic by walking the syntax tree) and `python` (a sandboxed subprocess; sandbox/runner.py;
`python_tool(SandboxLimits(...))` for other limits).
`ToolEnvironment` ("tools") answers a row's prompt with tools and ends at the first turn without a call; its final
reward is 0 unless a `reward_fn(final_answer, row)` hook is given (the caller's reward functions score it).

Adapters (adapters/): environments of other libraries (gymnasium-style, GEM, SkyRL-Gym, TextArena, verifiers,
OpenEnv, TRL's classes) registered by name, each importing its library only when built. `routed` (routed.py)
plays each row with the environment its `environment` column names; `environment_factory(spec, args)` resolves
a name or 'module:Class' the way argument files and `alignment-check-env` do.

Rollout (multiturn.py; imports paddle): `multi_turn_rollout(model, tokenizer, envs, rows, config, max_turns,
max_total_tokens, log_prob_temperature, max_length, row_seeds)` samples every row's turns with the KV cache
carried across turns and returns one `Trajectory`
per row: token ids as sampled, the action mask, the sampler's log-probs, per-turn rewards (and the token each
lands on), tool statistics; `pad_trajectories` lays them out as one batch. Observation tokens are the chat
template's text for the new messages only (chat.py). It is imported from `alignment.envs.multiturn`, so the
pure-Python parts above do not load paddle.
"""
from alignment.envs.base import (
    Environment,
    EnvironmentFailure,
    StepResult,
    TIMING_METRICS,
    checked_reset,
    checked_step,
    load_environment_modules,
    make_environment,
)
from alignment.envs.calculator import calculator
from alignment.envs.formats import HermesFormat, ToolCallFormat, tool_call_format
from alignment.envs.sandbox.runner import SandboxLimits, SandboxResult, python, python_tool, run_python
from alignment.envs.tool_env import BUILTIN_TOOLS, ToolEnvironment
from alignment.envs.tools import Tool, ToolCall, ToolResult, as_tool, run_tool_call, tool_schema
from alignment.envs.routed import RoutedEnvironment, environment_factory
import alignment.envs.adapters  # noqa: E402,F401  registers the library adapters (their libraries load lazily)

__all__ = [
    "BUILTIN_TOOLS",
    "Environment",
    "EnvironmentFailure",
    "HermesFormat",
    "RoutedEnvironment",
    "SandboxLimits",
    "SandboxResult",
    "StepResult",
    "TIMING_METRICS",
    "Tool",
    "ToolCall",
    "ToolCallFormat",
    "ToolEnvironment",
    "ToolResult",
    "as_tool",
    "calculator",
    "checked_reset",
    "checked_step",
    "environment_factory",
    "load_environment_modules",
    "make_environment",
    "python",
    "python_tool",
    "run_python",
    "run_tool_call",
    "tool_call_format",
    "tool_schema",
]
