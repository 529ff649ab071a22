"""OpenEnv environments ("openenv", `openenv-core`): an environment server's class run in-process, or a running
server reached by its client (a WebSocket session per episode), both awaited on the environments' event loop.

    "environment": "openenv",
    "environment_args": {"env": "my_envs.guess:GuessEnvironment", "env_args": {}}      # in-process
    "environment_args": {"base_url": "http://127.0.0.1:8000", "action_field": "message"}   # a running server

In-process: `env` is an `openenv.core.Environment` subclass; each episode awaits `reset_async(seed=...)` and
`step_async(action)`. Remote: `client` ('module:Class', an `EnvClient` subclass; default `GenericEnvClient`,
which sends the action as a dict) connects to `base_url`, then `reset(seed=...)` and `step(action)`; the session
closes when the episode ends. The policy's text becomes the action's `action_field` (default: the action class's
one required field besides metadata; `action` names the class when it cannot be read off the environment's
generic base). The observation's text is its `observation_field`, else its one field besides done, reward and
metadata, else those fields as JSON. reward (None = 0) and done are the observation's. The seed is the row's.
"""
from __future__ import annotations

import typing
from typing import Any, Dict, List, Mapping, Optional

from alignment.data import import_function
from alignment.envs.adapters.common import as_text, require, row_seed
from alignment.envs.base import Environment, Message, StepResult

_NOT_CONTENT = ("done", "reward", "metadata")


class OpenEnvEnvironment(Environment):
    NAME = "openenv"

    def __init__(self, env: Optional[str] = None, base_url: Optional[str] = None, client: Optional[str] = None,
                 env_args: Optional[Mapping[str, Any]] = None, action: Optional[str] = None,
                 action_field: Optional[str] = None, observation_field: Optional[str] = None):
        if (env is None) == (base_url is None):
            raise ValueError("environment 'openenv': environment_args needs one of 'env' ('module:Class' of an "
                             "openenv Environment, run in-process) and 'base_url' (a running server)")
        core = require("openenv.core", "openenv-core", self.NAME)
        self.label = env or base_url
        self.server: Any = None
        self.session: Any = None
        if env is not None:
            env_cls = import_function(env, "environment 'openenv' 'env'")
            self.server = env_cls(**dict(env_args or {}))
            action_cls = import_function(action, "environment 'openenv' 'action'") if action else \
                _generic_argument(type(self.server), core.Environment)
        else:
            self.client_cls = import_function(client, "environment 'openenv' 'client'") if client else \
                core.GenericEnvClient
            self.base_url = base_url
            action_cls = import_function(action, "environment 'openenv' 'action'") if action else None
        self.action_cls = action_cls
        self.action_field = action_field or _only_required_field(action_cls)
        if self.action_field is None:
            raise ValueError("environment 'openenv': set 'action_field' (the action field the policy's text fills)")
        self.observation_field = observation_field

    @property
    def env_name(self) -> str:
        return f"{self.NAME}[{self.label}]"

    async def reset(self, row: Mapping[str, Any]) -> List[Message]:
        seed = row_seed(row)
        if self.server is not None:
            observation = await self.server.reset_async(seed=seed)
            return [{"role": "user", "content": self._text(observation)}]
        await self._close()
        self.session = self.client_cls(base_url=self.base_url)
        await self.session.connect()
        result = await self.session.reset(seed=seed)
        return [{"role": "user", "content": self._text(result.observation)}]

    async def step(self, assistant_message: str) -> StepResult:
        action = {self.action_field: assistant_message}
        action = self.action_cls(**action) if self.action_cls is not None else action
        if self.server is not None:
            observation = await self.server.step_async(action)
            reward, done = observation.reward, observation.done
        else:
            result = await self.session.step(action)
            observation, reward, done = result.observation, result.reward, result.done
            if done:
                await self._close()
        text = self._text(observation)
        return StepResult([{"role": "user", "content": text}] if text else [], float(reward or 0.0), bool(done))

    async def _close(self) -> None:
        if self.session is not None:
            session, self.session = self.session, None
            await session.close()

    def _text(self, observation: Any) -> str:
        fields: Dict[str, Any] = observation.model_dump() if hasattr(observation, "model_dump") else \
            dict(observation or {})
        if self.observation_field is not None:
            return as_text(fields.get(self.observation_field, ""))
        content = {key: value for key, value in fields.items() if key not in _NOT_CONTENT}
        return as_text(next(iter(content.values())) if len(content) == 1 else content)


def _generic_argument(cls: type, base: type) -> Optional[type]:
    """ActT of `class X(Environment[ActT, ObsT, StateT])`, searched up the class's bases."""
    for klass in cls.__mro__:
        for parent in getattr(klass, "__orig_bases__", ()):
            if typing.get_origin(parent) is base and typing.get_args(parent):
                action = typing.get_args(parent)[0]
                return action if isinstance(action, type) else None
    return None


def _only_required_field(action_cls: Optional[type]) -> Optional[str]:
    fields = getattr(action_cls, "model_fields", {})
    required = [name for name, info in fields.items() if name != "metadata" and info.is_required()]
    return required[0] if len(required) == 1 else None
