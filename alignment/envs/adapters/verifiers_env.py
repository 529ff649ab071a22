"""verifiers environments ("verifiers"): `verifiers.load_environment(id, **args)`, its rollout driven by the
policy, its rubric as the reward.

    "environment": "verifiers",
    "environment_args": {"id": "my-env", "args": {"difficulty": 2}, "format": "hermes"}

A verifiers environment runs its own rollout (`env.rollout(input, client, model)`) and asks a client for each
model turn. The adapter hands it a client whose answers are the policy's turns: `reset` starts the rollout on the
environments' event loop and returns the prompt of its first model call; `step(text)` answers that call and
returns what the environment added before its next call (tool results, feedback), or, when the rollout ends,
the reward of `env.rubric.score_rollout(state)` with the rubric's per-function scores as metrics. Tools the
environment offers are shown in the tool-call format's convention (`format`), and the calls parsed from the
policy's text are the response's `tool_calls`. The rollout input is the row: its `input` as the user prompt
after the environment's system prompt and few-shot messages, `answer`, `info`; a row with an `example_id`
column plays that row of the environment's own dataset instead. Rubrics with group-level reward functions (in a
RubricGroup's rubrics too) are refused at load (they score a group at once). A rollout left waiting for a turn (its
episode cut by max_turns, or the run stopping) is cancelled on the environments' event loop (event_loop.py).
Needs verifiers 0.3 (the `verifiers.legacy` API, Python >= 3.11); with verifiers 0.4 (only the v1 API) installed,
building it stops with one line saying so.
"""
from __future__ import annotations

import asyncio
import functools
import json
import time
from typing import Any, Dict, List, Mapping, Optional

from alignment.envs.adapters.common import numbers, require
from alignment.envs.base import Environment, Message, StepResult
from alignment.envs.event_loop import cancel_soon, start_task
from alignment.envs.formats import tool_call_format
from alignment.envs.tool_env import prompt_messages


@functools.lru_cache(maxsize=None)
def _loaded(env_id: str, args_json: str):
    """One loaded verifiers environment per (id, args) per process: it serves every episode (as in verifiers)."""
    vf = require("verifiers", "verifiers", "verifiers")
    if not hasattr(vf, "load_environment"):  # 0.4 keeps only `verifiers.v1` (Taskset / Harness / Toolset)
        raise ValueError(f"environment 'verifiers': verifiers {getattr(vf, '__version__', '?')} is installed; this "
                         f"adapter plays environments of the verifiers 0.3 API (load_environment, rubrics), not "
                         f"0.4's v1 API (Taskset / Harness / Toolset); install verifiers==0.3.1 (requirements.txt)")
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


def as_message(message: Any) -> Message:
    """A verifiers message (pydantic or dict) as {"role", "content"} text."""
    data = message.model_dump() if hasattr(message, "model_dump") else dict(message)
    content = data.get("content") or ""
    if isinstance(content, list):
        content = "".join(part.get("text", "") for part in content if isinstance(part, Mapping))
    role = data.get("role")
    return {"role": role if role in ("system", "user", "assistant", "tool") else "user", "content": str(content)}


class VerifiersEnvironment(Environment):
    NAME = "verifiers"

    def __init__(self, id: str = "", args: Optional[Mapping[str, Any]] = None, format: str = "hermes"):
        if not id:
            raise ValueError("environment 'verifiers': environment_args needs 'id' (an installed verifiers "
                             "environment's module, as for verifiers.load_environment)")
        self.id = id
        self.env = _loaded(id, json.dumps(dict(args or {}), sort_keys=True))
        self.format = tool_call_format(format)
        self.episode: Optional[asyncio.Task] = None
        self.tool_schemas: List[Dict[str, Any]] = []  # shown to the policy (alignment-check-env reads them)

    @property
    def env_name(self) -> str:
        return f"{self.NAME}[{self.id}]"

    @property
    def stop_strings(self):
        return self.format.stop_strings if self.env.tool_defs else ()

    def rollout_input(self, row: Mapping[str, Any]) -> Dict[str, Any]:
        if row.get("example_id") is not None:
            return dict(self.env.get_dataset()[int(row["example_id"])])
        prompt = ([{"role": "system", "content": self.env.system_prompt}] if self.env.system_prompt else []) + \
            list(self.env.few_shot or []) + prompt_messages(row.get("input"))
        return {"prompt": prompt, "answer": str(row.get("answer") or ""), "info": row.get("info") or {},
                "example_id": 0}

    async def reset(self, row: Mapping[str, Any]) -> List[Message]:
        self._stop()
        self.client = _client_class()(self.format)
        self.episode = start_task(_play(self.env, self.client, self.rollout_input(row)))
        call = await self._next_call()
        if call is None:
            raise ValueError("the rollout ended before asking the model anything")
        prompt, tools, self.answer = call
        self.seen, self.tool_schemas = len(prompt), tools
        if tools:
            shown = self.format.system_prompt(tools)
            if prompt and prompt[0]["role"] == "system":
                return [{"role": "system", "content": f"{prompt[0]['content']}\n\n{shown}"}] + prompt[1:]
            return [{"role": "system", "content": shown}] + prompt
        return prompt

    async def step(self, assistant_message: str) -> StepResult:
        self.answer.set_result(assistant_message)
        call = await self._next_call()
        if call is not None:
            prompt, _tools, self.answer = call
            observation, self.seen = prompt[self.seen + 1:], len(prompt)  # after the assistant turn just given
            return StepResult(observation, 0.0, False)
        state = self.episode.result()
        metrics = numbers(state.get("metrics") or {})
        metrics["errors"] = float(state.get("error") is not None)
        return StepResult([], float(state.get("reward") or 0.0), True, metrics)

    async def _next_call(self):
        """The rollout's next model call (prompt, tools, answer future), or None when the rollout has ended."""
        getter = asyncio.ensure_future(self.client.calls.get())
        await asyncio.wait({getter, self.episode}, return_when=asyncio.FIRST_COMPLETED)
        if getter.done():
            return getter.result()
        getter.cancel()
        self.episode.result()  # the rollout's own exception, if it raised
        return None

    def _stop(self) -> None:
        cancel_soon(self.episode)

    def __del__(self):  # an episode cut by max_turns leaves its rollout waiting for a turn that never comes
        try:
            self._stop()
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass


async def _play(env, client, rollout_input: Dict[str, Any]):
    """One rollout, scored. A function, not a method: the task must not refer to the adapter, whose collection
    (when the rollout drops an episode cut by max_turns) is what cancels it."""
    state = await env.rollout(rollout_input, client, "policy", None)
    await env.rubric.score_rollout(state)
    return state
