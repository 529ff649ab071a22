"""verifiers environments ("verifiers"), as the installed verifiers plays them.

    "environment": "verifiers",
    "environment_args": {"id": "my-env", "args": {"difficulty": 2}, "format": "hermes"}

Two routes, chosen by the installed version: verifiers 0.4 (its v1 API: Taskset / Task / Toolset, `@vf.reward`;
`pip install -r requirements-verifiers.txt` in its own environment) is played by verifiers_v1.py, `id` naming a
taskset; verifiers 0.3 (requirements.txt pins 0.3.1, the `verifiers.legacy` API, Python >= 3.11) by this module,
`id` naming an environment module for `verifiers.load_environment(id, **args)`, its rollout driven by the policy
and its rubric as the reward. Both drive the library's own rollout and answer its model calls with the policy's
turns: `reset` starts the rollout on the environments' event loop and returns the prompt of its first model call;
`step(text)` answers that call and returns what the rollout added before its next call (tool results, feedback),
or, when the rollout ends, its reward with the per-function scores as metrics. Tools are shown in the tool-call
format's convention (`format`), and the calls parsed from the policy's text are the response's `tool_calls`.

0.3 route: the rollout input is the row: its `input` as the user prompt after the environment's system prompt and
few-shot messages, `answer`, `info`; a row with an `example_id` column plays that row of the environment's own
dataset instead. Rubrics with group-level reward functions (in a RubricGroup's rubrics too) are refused at load
(they score a group at once). A rollout left waiting for a turn (its episode cut by max_turns, or the run
stopping) is cancelled on the environments' event loop (event_loop.py), on both routes.
"""
from __future__ import annotations

import asyncio
import functools
import importlib.metadata
import json
import time
from typing import Any, Dict, List, Mapping

from alignment.envs.adapters.common import numbers, require
from alignment.envs.adapters.policy_turns import PolicyTurns, as_message
from alignment.envs.event_loop import start_task
from alignment.envs.tool_env import prompt_messages


@functools.lru_cache(maxsize=None)
def _loaded(env_id: str, args_json: str):
    """One loaded verifiers environment per (id, args) per process: it serves every episode (as in verifiers)."""
    vf = require("verifiers", "verifiers", "verifiers")
    try:
        env = vf.load_environment(env_id, **json.loads(args_json))
    except Exception as err:  # noqa: BLE001 - the environment's own loading code: one line naming it
        raise ValueError(f"environment 'verifiers': load_environment({env_id!r}) failed: "
                         f"{type(err).__name__}: {err}") from err
    grouped = [getattr(func, "__name__", repr(func)) for func in group_reward_functions(env.rubric)]
    if grouped:
        which = (f"reward function {grouped[0]!r} of its rubric is" if len(grouped) == 1 else
                 f"reward functions {', '.join(map(repr, grouped))} of its rubric are")
        raise ValueError(f"environment 'verifiers' {env_id!r}: {which} group-level (it scores a whole group at "
                         f"once); only per-rollout reward functions are supported")
    return env


def group_reward_functions(rubric) -> List[Any]:
    """The rubric's group-level reward functions, those of the rubrics inside a RubricGroup included (its own
    `_get_group_reward_funcs` sees only its own, empty, function list)."""
    found = list(rubric._get_group_reward_funcs())
    for inner in getattr(rubric, "rubrics", None) or []:
        found += group_reward_functions(inner)
    return found


@functools.lru_cache(maxsize=None)
def _client_class():
    """verifiers' Client for the policy: each model call waits for the policy's turn (`PolicyClient.answer`)."""
    vf = require("verifiers", "verifiers", "verifiers")

    class PolicyClient(vf.Client):
        def __init__(self, tool_format):
            super().__init__(None)
            self.format = tool_format
            self.calls: asyncio.Queue = asyncio.Queue()  # (prompt dicts, tool schemas, future of the text)
            self.count = 0

        def setup_client(self, config):
            return None

        async def to_native_tool(self, tool):
            return {"type": "function", "function": {"name": tool.name, "description": tool.description,
                                                     "parameters": tool.parameters}}

        async def to_native_prompt(self, messages):
            return [as_message(message) for message in messages], {}

        async def get_native_response(self, prompt, model, sampling_args, tools=None, **kwargs):
            answer = asyncio.get_running_loop().create_future()
            await self.calls.put((prompt, tools or [], answer))
            return await answer

        async def raise_from_native_response(self, response):
            return None

        async def from_native_response(self, text):
            self.count += 1
            calls = [vf.ToolCall(id=f"call_{self.count}_{i}", name=call.name, arguments=json.dumps(call.arguments))
                     for i, call in enumerate(self.format.parse(text)) if call.error is None]
            message = vf.ResponseMessage(content=text, tool_calls=calls or None, is_truncated=False,
                                         finish_reason="tool_calls" if calls else "stop")
            return vf.Response(id=f"policy-{self.count}", created=int(time.time()), model="policy", message=message)

        async def close(self):
            return None

    return PolicyClient


def _verifiers_04() -> bool:
    try:
        return tuple(int(part) for part in importlib.metadata.version("verifiers").split(".")[:2]) >= (0, 4)
    except (importlib.metadata.PackageNotFoundError, ValueError):
        return False


class VerifiersEnvironment(PolicyTurns):
    NAME = "verifiers"

    def __new__(cls, *args, **kwargs):
        if cls is VerifiersEnvironment and _verifiers_04():  # the v1 route (verifiers_v1.py)
            from alignment.envs.adapters.verifiers_v1 import VerifiersV1Environment
            return VerifiersV1Environment(*args, **kwargs)
        return super().__new__(cls)

    ID = "an installed verifiers environment's module, as for verifiers.load_environment"

    def _load(self, args_json: str) -> None:
        self.env = _loaded(self.id, args_json)
        self.has_tools = bool(self.env.tool_defs)

    def rollout_input(self, row: Mapping[str, Any]) -> Dict[str, Any]:
        if row.get("example_id") is not None:
            return dict(self.env.get_dataset()[int(row["example_id"])])
        prompt = ([{"role": "system", "content": self.env.system_prompt}] if self.env.system_prompt else []) + \
            list(self.env.few_shot or []) + prompt_messages(row.get("input"))
        return {"prompt": prompt, "answer": str(row.get("answer") or ""), "info": row.get("info") or {},
                "example_id": 0}

    async def _start(self, row: Mapping[str, Any]):
        client = _client_class()(self.format)
        return client.calls, start_task(_play(self.env, client, self.rollout_input(row)))

    def _outcome(self, state):
        metrics = numbers(state.get("metrics") or {})
        metrics["errors"] = float(state.get("error") is not None)
        return float(state.get("reward") or 0.0), metrics


async def _play(env, client, rollout_input: Dict[str, Any]):
    """One rollout, scored. A function, not a method: the task must not refer to the adapter, whose collection
    (when the rollout drops an episode cut by max_turns) is what cancels it."""
    state = await env.rollout(rollout_input, client, "policy", None)
    await env.rubric.score_rollout(state)
    return state
