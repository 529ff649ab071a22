"""`ToolEnvironment` ("tools"): the policy answers a dataset row's prompt, calling tools on the way; the episode
ends at the first assistant turn without a tool call. Pure Python (no paddle)."""
from __future__ import annotations

from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Union

from alignment.envs.base import Environment, Message, StepResult
from alignment.envs.calculator import calculator
from alignment.envs.formats import tool_call_format
from alignment.envs.sandbox.runner import SandboxLimits, SandboxUnavailable, check_tools, python_tool, sandbox_limits
from alignment.envs.tool_specs import resolve_tools
from alignment.envs.tools import Tool, ToolCall, ToolResult, as_tool, run_tool_call

BUILTIN_TOOLS: Dict[str, Tool] = {
    "calculator": as_tool(calculator, timeout=5.0),
    "python": python_tool(SandboxLimits()),
}

RewardHook = Callable[[str, Mapping[str, Any]], float]


class ToolEnvironment(Environment):
    """A prompt answered with tools.

    reset(row): the row's `input` (a string, or alternating user/assistant turns) after a system message that
    shows the tools in the format's convention (`system_prompt`, if given, comes first). A row may narrow the
    tools with a `tools` list of names.
    step(text): every call in the turn is run (at most `max_calls_per_turn`; the rest get an error), each result
    (or error text: unknown tool, bad JSON, bad arguments, a raise, a timeout) a `tool` message; reward 0. A turn
    without a call ends the episode with reward `final_reward(text)`.

    tool_role: the role of result messages; "user" for a chat template that has no `tool` role (the fallback
    template of checkpoints without one renders every other role as an assistant turn).

    Final reward hook: `reward_fn(final_answer, row) -> float` when given; by default 0.0, leaving the final
    answer to the caller's reward functions / reward model (as for single-turn rollouts).

    python_sandbox: SandboxLimits fields for the built-in `python` tool (sandbox/runner.py), e.g.
    {"wall_seconds": 10} or {"containment": "best-effort"}; an argument file sets them in environment_args. Built
    with a `python` tool, the environment checks once per process that the sandbox's containment holds on this
    machine (a ValueError naming what the kernel lacks when it does not).
    """

    NAME = "tools"

    def __init__(self, tools: Sequence[Union[str, Tool, Callable[..., Any]]] = ("calculator",),
                 format: str = "hermes", max_calls_per_turn: int = 4, system_prompt: str = "",
                 reward_fn: Optional[RewardHook] = None, tool_role: str = "tool",
                 python_sandbox: Optional[Mapping[str, Any]] = None):
        if max_calls_per_turn < 1:
            raise ValueError(f"environment 'tools': max_calls_per_turn must be >= 1, got {max_calls_per_turn}")
        if tool_role not in ("tool", "user"):
            raise ValueError(f"environment 'tools': tool_role must be 'tool' or 'user', got {tool_role!r}")
        try:
            self.tools = resolve_tools(tools, _builtins(tools, python_sandbox))
            self.format = tool_call_format(format)
            check_tools(self.tools.values())
        except (ValueError, SandboxUnavailable) as err:
            raise ValueError(f"environment 'tools': {err}") from None
        self.max_calls_per_turn = max_calls_per_turn
        self.system_prompt = system_prompt
        self.reward_fn = reward_fn
        self.tool_role = tool_role
        self.active: Dict[str, Tool] = dict(self.tools)
        self.row: Mapping[str, Any] = {}

    @property
    def stop_strings(self) -> Sequence[str]:
        """Where a turn ends besides eos: after a complete tool call."""
        return self.format.stop_strings

    def reset(self, row: Mapping[str, Any]) -> List[Message]:
        self.row = row
        self.active = self._row_tools(row.get("tools"))
        system = self.format.system_prompt([tool.schema for tool in self.active.values()])
        system = f"{self.system_prompt}\n\n{system}" if self.system_prompt else system
        return [{"role": "system", "content": system}] + prompt_messages(row.get("input"))

    def step(self, assistant_message: str) -> StepResult:
        calls = self.format.parse(assistant_message)
        if not calls:
            return StepResult([], self.final_reward(assistant_message), True)
        results = [run_tool_call(call, self.active) for call in calls[: self.max_calls_per_turn]]
        extra = ToolCall("", {}, f"at most {self.max_calls_per_turn} tool calls per turn; this one was not run")
        results += [run_tool_call(extra, self.active) for _ in calls[self.max_calls_per_turn:]]
        return StepResult([{"role": self.tool_role, "content": result.content} for result in results], 0.0, False,
                          tool_metrics(results))

    def final_reward(self, answer: str) -> float:
        return 0.0 if self.reward_fn is None else float(self.reward_fn(answer, self.row))

    def _row_tools(self, names: Any) -> Dict[str, Tool]:
        if names is None:
            return dict(self.tools)
        if not isinstance(names, (list, tuple)) or not all(isinstance(name, str) for name in names):
            raise ValueError(f"row key 'tools' must be a list of tool names, got {names!r}")
        unknown = [name for name in names if name not in self.tools]
        if unknown:
            raise ValueError(f"row asks for tools {unknown} this environment was not given "
                             f"(it has: {', '.join(sorted(self.tools))})")
        return {name: self.tools[name] for name in names}


def _builtins(tools: Sequence[Any], python_sandbox: Optional[Mapping[str, Any]]) -> Dict[str, Tool]:
    """The built-in tools, `python` with the limits of `python_sandbox` when given."""
    if python_sandbox is None:
        return BUILTIN_TOOLS
    if "python" not in tools:
        raise ValueError("python_sandbox is set but 'python' is not among the tools")
    return {**BUILTIN_TOOLS, "python": python_tool(sandbox_limits(python_sandbox))}


def tool_metrics(results: Sequence[ToolResult]) -> Dict[str, float]:
    return {"tool_calls": float(len(results)), "tool_errors": float(sum(result.error for result in results)),
            "tool_time": float(sum(result.seconds for result in results))}


def prompt_messages(turns: Any) -> List[Message]:
    """A RawSample `input` (a string, or alternating user/assistant turns starting with the user) -> messages."""
    if isinstance(turns, str):
        turns = [turns]
    if not isinstance(turns, list) or not turns or not all(isinstance(turn, str) for turn in turns):
        raise ValueError(f"row key 'input' must be a string or a non-empty list of strings, got {turns!r}")
    return [{"role": "user" if i % 2 == 0 else "assistant", "content": text} for i, text in enumerate(turns)]
