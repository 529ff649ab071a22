"""The environment API: `Environment` (registered by `NAME`), `StepResult`, and the checks applied to what a user
environment returns. Pure Python (no paddle)."""
from __future__ import annotations

import inspect
import math
import numbers
import os
from typing import Any, Dict, Iterable, List, Mapping, NamedTuple, Optional, Sequence, Union

from alignment.config.registry import ENVIRONMENTS, Registered
from alignment.data import import_user_modules
from alignment.envs.event_loop import run_awaitable

Message = Dict[str, str]  # {"role": ..., "content": ...}

ROLES = ("system", "user", "assistant", "tool")


# StepResult metrics that measure wall-clock time: they differ between two plays of one episode, so comparisons of
# episodes (alignment-check-env's determinism check) leave them out.
TIMING_METRICS = frozenset({"tool_time"})


class EnvironmentFailure(RuntimeError):
    """A user environment raised, or returned something outside the API; the message names the environment."""


class StepResult(NamedTuple):
    """What `Environment.step` returns: the messages the policy sees next (e.g. tool results, feedback), the
    reward of this turn, whether the episode is over, and numbers to log (summed over a trajectory's turns:
    `tool_calls`, `tool_errors`, `tool_time` are the ones the rollout reports)."""
    observation: List[Message]
    reward: float = 0.0
    done: bool = False
    metrics: Mapping[str, float] = {}


class Environment(Registered, registry=ENVIRONMENTS):
    """One episode of a multi-turn task, one instance per rollout row. Subclass with a `NAME` to register::

        class GuessNumber(Environment):
            NAME = "guess-number"

            def reset(self, row):
                self.secret = int(row["answer"])
                return [{"role": "user", "content": "Guess my number (1-100)."}]

            def step(self, assistant_message):
                guess = int(assistant_message.strip() or 0)
                if guess == self.secret:
                    return StepResult([], reward=1.0, done=True)
                hint = "higher" if guess < self.secret else "lower"
                return StepResult([{"role": "user", "content": hint}])

    `reset(row)` gets the dataset row and returns the first messages (chat dicts with "role" and "content");
    `step(text)` gets the assistant's turn as text and returns a StepResult. An episode that never sets `done`
    ends at the rollout's `max_turns`. The observation may be empty only when `done` is true. A turn ends at eos,
    at the per-turn token limit, or after one of `stop_strings`. `reset` and `step` may be `async def` (a remote
    game server, an HTTP tool): they are awaited on one shared event loop, so the waits of a batch overlap.
    """

    stop_strings: Sequence[str] = ()  # text that ends an assistant turn besides eos (e.g. a tool call's close)

    def reset(self, row: Mapping[str, Any]) -> List[Message]:
        raise NotImplementedError

    def step(self, assistant_message: str) -> StepResult:
        raise NotImplementedError

    @property
    def env_name(self) -> str:
        return getattr(type(self), "NAME", type(self).__qualname__)


def make_environment(name: str, **kwargs: Any) -> Environment:
    """A new instance of the environment registered as `name`."""
    return Environment.lookup(name)(**kwargs)


def load_environment_modules(paths: Union[Iterable[Union[str, os.PathLike]], str, None],
                             base_dir: Optional[Union[str, os.PathLike]] = None) -> list:
    """Import `user_env_modules` (files or dotted modules) so their environments register; relative files are
    looked up under `base_dir` (the argument file's directory) then the current directory."""
    try:
        return import_user_modules(paths, base_dir=base_dir)
    except FileNotFoundError as err:
        raise FileNotFoundError(f"key 'user_env_modules': {err}") from None


# --------------------------------------------------------------------------- checks


def checked_reset(env: Environment, row: Mapping[str, Any]) -> List[Message]:
    """env.reset(row), with an EnvironmentFailure naming the environment if it raises or returns no messages."""
    try:
        messages = _resolved(env.reset(row))
    except Exception as err:  # a user environment's bug: name it, keep the cause
        raise EnvironmentFailure(f"environment {env.env_name!r}: reset raised {_one_line(err)}") from err
    messages = check_messages(messages, f"environment {env.env_name!r}: reset")
    if not messages:
        raise EnvironmentFailure(f"environment {env.env_name!r}: reset returned no messages")
    return messages


def checked_step(env: Environment, assistant_message: str) -> StepResult:
    """env.step(text), checked: a StepResult (or a 3/4-tuple) of messages, a finite number and a bool."""
    where = f"environment {env.env_name!r}: step"
    try:
        result = _resolved(env.step(assistant_message))
    except Exception as err:
        raise EnvironmentFailure(f"{where} raised {_one_line(err)}") from err
    if not isinstance(result, tuple) or len(result) not in (3, 4):
        raise EnvironmentFailure(f"{where} returned a {type(result).__name__}; it must return "
                                 f"StepResult(observation, reward, done)")
    observation, reward, done = result[:3]
    metrics = result[3] if len(result) == 4 else {}
    observation = check_messages(observation, where)
    if isinstance(reward, bool) or not isinstance(reward, numbers.Real) or not math.isfinite(float(reward)):
        raise EnvironmentFailure(f"{where} returned reward {reward!r}; it must be a finite number")
    if not isinstance(done, bool):
        raise EnvironmentFailure(f"{where} returned done={done!r}; it must be True or False")
    if not done and not observation:
        raise EnvironmentFailure(f"{where} returned no observation messages for an episode that is not done")
    if not isinstance(metrics, Mapping) or not all(isinstance(v, numbers.Real) for v in metrics.values()):
        raise EnvironmentFailure(f"{where} returned metrics {metrics!r}; they must be a dict of numbers")
    return StepResult(observation, float(reward), done, dict(metrics))


def _resolved(value: Any) -> Any:
    """An async method's result: its coroutine awaited on the environments' event loop."""
    return run_awaitable(value) if inspect.isawaitable(value) else value


def _one_line(err: BaseException) -> str:
    return " ".join(f"{type(err).__name__}: {err}".split())


def checked_stop_strings(env: Environment) -> tuple:
    """env.stop_strings as a tuple of non-empty strings, else an EnvironmentFailure naming the environment."""
    stops = env.stop_strings
    if isinstance(stops, str) or not isinstance(stops, (list, tuple)) or not all(
            isinstance(stop, str) and stop for stop in stops):
        raise EnvironmentFailure(f"environment {env.env_name!r}: stop_strings must be a list of non-empty strings, "
                                 f"got {stops!r}")
    return tuple(stops)


def check_messages(messages: Any, where: str) -> List[Message]:
    """A list of {"role": one of ROLES, "content": str} dicts, else EnvironmentFailure saying what is wrong."""
    if not isinstance(messages, list):
        raise EnvironmentFailure(f"{where} returned a {type(messages).__name__} for the messages; they must be a "
                                 f"list of {{'role', 'content'}} dicts")
    for i, message in enumerate(messages):
        if not isinstance(message, Mapping):
            raise EnvironmentFailure(f"{where} returned message {i} as a {type(message).__name__}; "
                                     f"it must be a {{'role', 'content'}} dict")
        if message.get("role") not in ROLES:
            raise EnvironmentFailure(f"{where} returned message {i} with role {message.get('role')!r}; "
                                     f"it must be one of {', '.join(ROLES)}")
        if not isinstance(message.get("content"), str):
            raise EnvironmentFailure(f"{where} returned message {i} with content of type "
                                     f"{type(message.get('content')).__name__}; it must be a string")
    return [dict(message) for message in messages]
