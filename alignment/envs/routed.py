"""Naming an environment (one syntax for argument files and `alignment-check-env`), and "routed": one run, rows
played by different environments.

An environment spec is a registered name ("tools", "gem", a user environment's NAME from `user_env_modules`),
or 'module:Class' / 'file.py:Class' of an `Environment` subclass, with its constructor's keyword arguments
beside it (`environment_args`). `environment_factory(spec, args)` checks both and returns a function building
new instances.

    "environment": "routed",
    "environment_args": {"environments": {
        "math": {"environment": "skyrl-gym", "environment_args": {"id": "gsm8k"}},
        "game": {"environment": "textarena", "environment_args": {"id": "TicTacToe-v0"}},
        "guess": "examples/guess_number_env.py:GuessNumber"}}

Each row's `environment` column (`column`) picks the environment that plays it; the routed environment builds
that one in `reset(row)` and passes every call to it (its stop strings are the chosen one's once reset).
"""
from __future__ import annotations

import functools
import json
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence

from alignment.data import import_function
from alignment.envs.base import Environment, Message, StepResult


def environment_factory(spec: str, args: Optional[Mapping[str, Any]] = None,
                        where: str = "key 'environment'") -> Callable[[], Environment]:
    """A function building new instances of the environment `spec` names with `args`; a ValueError starting
    with `where` when the name is unknown or the constructor refuses the arguments (checked by building one)."""
    if not isinstance(spec, str) or not spec:
        raise ValueError(f"{where}: an environment is named by a string, got {spec!r}")
    if ":" in spec:
        cls = import_function(spec, where)
        if not (isinstance(cls, type) and issubclass(cls, Environment)):
            raise ValueError(f"{where}: {spec!r} is not an Environment subclass (a library's environment is "
                             f"named by its adapter: gymnasium, gem, skyrl-gym, textarena, verifiers, openenv, trl)")
    elif spec in Environment.registered_names():
        cls = Environment.lookup(spec)
    else:
        raise ValueError(f"{where}: {spec!r} is not a registered environment; registered: "
                         f"{', '.join(Environment.registered_names())} (or 'module:Class' / 'file.py:Class'; a user "
                         f"environment registers when its file is listed in 'user_env_modules')")
    args = dict(args or {})

    def build() -> Environment:
        try:
            return cls(**args)
        except (TypeError, ValueError) as err:
            raise ValueError(f"{where}: environment {spec!r} refused its arguments {args}: {err}") from None

    build()
    return build


class RoutedEnvironment(Environment):
    """Rows played by different environments: `environments` maps a row's `column` value to a spec (a string, or
    {"environment": spec, "environment_args": {...}})."""

    NAME = "routed"

    def __init__(self, environments: Optional[Mapping[str, Any]] = None, column: str = "environment"):
        if not environments or not isinstance(environments, Mapping):
            raise ValueError("environment 'routed': environment_args needs 'environments', a dict from the values of "
                             f"the rows' {column!r} column to environments")
        self.column = column
        self.factories = _factories(json.dumps(environments, sort_keys=True, default=str))
        self.current: Optional[Environment] = None

    @property
    def env_name(self) -> str:
        return self.current.env_name if self.current is not None else self.NAME

    @property
    def stop_strings(self) -> Sequence[str]:
        return self.current.stop_strings if self.current is not None else ()

    def reset(self, row: Mapping[str, Any]) -> List[Message]:
        key = row.get(self.column)
        if key not in self.factories:
            raise ValueError(f"row key {self.column!r} is {key!r}; the routed environments are "
                             f"{', '.join(map(repr, self.factories))}")
        self.current = self.factories[key]()
        return self.current.reset(row)  # an async environment's coroutine is awaited by the caller

    def step(self, assistant_message: str) -> StepResult:
        return self.current.step(assistant_message)


@functools.lru_cache(maxsize=None)
def _factories(environments_json: str) -> Dict[str, Callable[[], Environment]]:
    """The entries checked once per process (a run builds a routed environment for every row)."""
    factories = {}
    for key, entry in json.loads(environments_json).items():
        spec, args = (entry, {}) if isinstance(entry, str) else _spec_and_args(entry, key)
        factories[key] = environment_factory(spec, args, f"environment 'routed' entry {key!r}")
    return factories


def _spec_and_args(entry: Any, key: str):
    if not isinstance(entry, Mapping) or not isinstance(entry.get("environment"), str) or \
            set(entry) - {"environment", "environment_args"}:
        raise ValueError(f"environment 'routed' entry {key!r}: give a spec string or {{\"environment\": ..., "
                         f"\"environment_args\": {{...}}}}, got {entry!r}")
    return entry["environment"], entry.get("environment_args") or {}
