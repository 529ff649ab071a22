"""TRL's environment classes ("trl"), as `GRPOTrainer(environment_factory=...)` uses them; TRL itself is not
needed (it needs torch), only the class.

    "environment": "trl",
    "environment_args": {"cls": "my_envs.py:CalculatorEnv", "format": "hermes"}

The class is built without arguments, one instance per episode. `reset(**row)` gets the row's columns (`prompt`
as chat messages, `answer`, the rest as written) and returns None or text that is appended to the last user
message. Its public methods (not `reset`, not `get_reward`, not starting with "_") are the tools: type hints and
a Google-style docstring give their schema, `async def` ones are awaited on the environments' event loop. The
episode is a tool episode (ToolEnvironment): each turn's calls run, a turn without a call ends it. The final
reward is `get_reward()` when the class defines it (sync or async), else 0 (the run's reward functions score
the answer).
"""
from __future__ import annotations

import functools
import inspect
from typing import Any, Callable, List, Mapping

from alignment.data import import_function
from alignment.envs.base import Message
from alignment.envs.event_loop import run_awaitable
from alignment.envs.tool_env import ToolEnvironment, prompt_messages
from alignment.envs.tools import as_tool


class TRLEnvironment(ToolEnvironment):
    NAME = "trl"

    def __init__(self, cls: Any = None, **tool_env_args: Any):
        if cls is None:
            raise ValueError("environment 'trl': environment_args needs 'cls' ('module:Class' or 'file.py:Class' of "
                             "a TRL environment class)")
        env_cls = import_function(cls, "environment 'trl' 'cls'") if isinstance(cls, str) else cls
        self.label = getattr(env_cls, "__name__", str(cls))
        self.instance = env_cls()
        if not callable(getattr(self.instance, "reset", None)):
            raise ValueError(f"environment 'trl': class {self.label!r} has no reset method")
        names = [name for name, _ in inspect.getmembers(type(self.instance), predicate=inspect.isfunction)
                 if name not in ("reset", "get_reward") and not name.startswith("_")]
        tools = [as_tool(_synchronous(getattr(self.instance, name))) for name in names]
        super().__init__(tools=tools, reward_fn=self._reward if hasattr(self.instance, "get_reward") else None,
                         **tool_env_args)

    @property
    def env_name(self) -> str:
        return f"{self.NAME}[{self.label}]"

    def reset(self, row: Mapping[str, Any]) -> List[Message]:
        prompt = prompt_messages(row.get("input"))
        columns = {key: value for key, value in row.items() if key != "input"}
        added = _resolved(self.instance.reset(prompt=prompt, **columns))
        messages = super().reset(row)
        if added is not None:
            if not isinstance(added, str):
                raise TypeError(f"reset returned a {type(added).__name__}; it must return None or a string")
            messages[-1] = {**messages[-1], "content": messages[-1]["content"] + added}
        return messages

    def _reward(self, answer: str, row: Mapping[str, Any]) -> float:
        return float(_resolved(self.instance.get_reward()))


def _resolved(value: Any) -> Any:
    return run_awaitable(value) if inspect.isawaitable(value) else value


def _synchronous(method: Callable[..., Any]) -> Callable[..., Any]:
    """An `async def` tool as a plain function (awaited on the environments' loop); others as they are."""
    if not inspect.iscoroutinefunction(method):
        return method

    @functools.wraps(method)
    def call(*args, **kwargs):
        return run_awaitable(method(*args, **kwargs))

    return call
