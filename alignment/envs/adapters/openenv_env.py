"""OpenEnv environments ("openenv", the `openenv` package, 0.10; `openenv-core` 0.3 works too): an environment
server's class run in-process, found by id, or a running server reached by its client (a WebSocket session per
episode), all awaited on the environments' event loop.

    "environment": "openenv",
    "environment_args": {"env": "my_envs.guess:GuessEnvironment", "env_args": {}}      # in-process
    "environment_args": {"id": "envs/guess_env"}       # in-process: a local environment directory or package
    "environment_args": {"base_url": "http://127.0.0.1:8000", "action_field": "message"}   # a running server
    "environment_args": {"base_url": "http://127.0.0.1:8000", "tools": true}   # its MCP tools

In-process: `env` is an `openenv.core.Environment` subclass, or `id` names a local environment directory or an
installed environment package (openenv_sources.py); each episode awaits `reset_async(seed=...)` and
`step_async(action)`. Remote: `client` ('module:Class', an `EnvClient` subclass; default `GenericEnvClient`,
which sends the action as a dict) connects to `base_url`, then `reset(seed=...)` and `step(action)`; the session
closes when the episode ends. The policy's text becomes the action's `action_field` (default: the action class's
one required field besides metadata; `action` names the class when it cannot be read off the environment's
generic base). The observation's text is its `observation_field`, else its one field besides done, reward and
metadata, else those fields as JSON. reward (None = 0) and done are the observation's. The seed is the row's.

MCP tools (`tools`; on by default for an in-process `MCPEnvironment`): the tools the environment lists are shown
in the tool-call format's convention (`format`), their schemas passed through; each call parsed from the policy's
turn is a `call_tool` action, its result a `tool` message; the turn's reward is the sum of those steps' rewards
and it ends the episode when one of them is done. A turn without a call ends the episode.
"""
from __future__ import annotations

import typing
from typing import Any, Dict, List, Mapping, Optional

from alignment.data import import_function
from alignment.envs.adapters.common import as_text, require, row_seed
from alignment.envs.adapters.openenv_sources import environment_class, tool_schemas, tool_text
from alignment.envs.base import Environment, Message, StepResult
from alignment.envs.formats import tool_call_format

_NOT_CONTENT = ("done", "reward", "metadata")


class OpenEnvEnvironment(Environment):
    NAME = "openenv"

    def __init__(self, env: Optional[str] = None, base_url: Optional[str] = None, client: Optional[str] = None,
                 env_args: Optional[Mapping[str, Any]] = None, action: Optional[str] = None,
                 action_field: Optional[str] = None, observation_field: Optional[str] = None,
                 id: Optional[str] = None, tools: Optional[bool] = None, format: str = "hermes"):
        if sum(source is not None for source in (env, id, base_url)) != 1:
            raise ValueError("environment 'openenv': environment_args needs one of 'env' ('module:Class' of an "
                             "openenv Environment, run in-process), 'id' (a local environment directory or an "
                             "installed environment package) and 'base_url' (a running server)")
        core = require("openenv.core", "openenv", self.NAME)
        self.label = env or id or base_url
        self.server: Any = None
        self.session: Any = None
        if base_url is None:
            env_cls = environment_class(id, core.Environment) if id is not None else \
                import_function(env, "environment 'openenv' 'env'")
            self.server = env_cls(**dict(env_args or {}))
            action_cls = import_function(action, "environment 'openenv' 'action'") if action else \
                _generic_argument(type(self.server), core.Environment)
        else:
            self.client_cls = import_function(client, "environment 'openenv' 'client'") if client else \
                core.GenericEnvClient
            self.base_url = base_url
            action_cls = import_function(action, "environment 'openenv' 'action'") if action else None
        mcp_environment = getattr(core, "MCPEnvironment", None)
        self.tools = bool(tools) if tools is not None else \
            (mcp_environment is not None and isinstance(self.server, mcp_environment))
        self.format = tool_call_format(format)
        self.core = core
        self.action_cls = action_cls
        self.action_field = action_field or _only_required_field(action_cls)
        if self.action_field is None and not self.tools:
            raise ValueError("environment 'openenv': set 'action_field' (the action field the policy's text fills)")
        self.observation_field = observation_field
        self.tool_schemas: List[Dict[str, Any]] = []

    @property
    def env_name(self) -> str:
        return f"{self.NAME}[{self.label}]"

    @property
    def stop_strings(self):
        return self.format.stop_strings if self.tools else ()

    async def reset(self, row: Mapping[str, Any]) -> List[Message]:
        seed = row_seed(row)
        if self.server is not None:
            observation = await self.server.reset_async(seed=seed)
        else:
            await self._close()
            self.session = self.client_cls(base_url=self.base_url)
            await self.session.connect()
            observation = (await self.session.reset(seed=seed)).observation
        prompt = [{"role": "user", "content": self._text(observation)}]
        if not self.tools:
            return prompt
        listed, _, _ = await self._act(self._mcp_action("list_tools"))
        self.tool_schemas = tool_schemas(listed)
        return [{"role": "system", "content": self.format.system_prompt(self.tool_schemas)}] + prompt

    async def step(self, assistant_message: str) -> StepResult:
        if self.tools:
            return await self._tool_step(assistant_message)
        action = {self.action_field: assistant_message}
        action = self.action_cls(**action) if self.action_cls is not None else action
        observation, reward, done = await self._act(action)
        if done:
            await self._close()
        text = self._text(observation)
        return StepResult([{"role": "user", "content": text}] if text else [], float(reward or 0.0), bool(done))

    async def _tool_step(self, assistant_message: str) -> StepResult:
        calls = self.format.parse(assistant_message)
        if not calls:
            await self._close()
            return StepResult([], 0.0, True)
        messages, reward, done = [], 0.0, False
        for call in calls:
            if call.error is not None:
                messages.append({"role": "tool", "content": f"Error: {call.error}"})
                continue
            observation, step_reward, step_done = await self._act(
                self._mcp_action("call_tool", tool_name=call.name, arguments=call.arguments))
            messages.append({"role": "tool", "content": tool_text(observation)})
            reward, done = reward + float(step_reward or 0.0), done or bool(step_done)
            if done:
                await self._close()
                break
        return StepResult(messages, reward, done)

    async def _act(self, action: Any):
        """(observation, reward, done) of one step, in-process or over the session."""
        if self.server is not None:
            observation = await self.server.step_async(action)
            return observation, observation.reward, observation.done
        result = await self.session.step(action)
        return result.observation, result.reward, result.done

    def _mcp_action(self, kind: str, **fields: Any) -> Any:
        """An MCP action: the class in-process, its JSON form (as the `/ws` session sends it) to a server."""
        if self.server is None:
            return {"type": kind, **fields}
        return (self.core.CallToolAction if kind == "call_tool" else self.core.ListToolsAction)(**fields)

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
