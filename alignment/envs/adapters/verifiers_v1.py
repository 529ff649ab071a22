"""verifiers 0.4 environments (its v1 API), played by "verifiers" when verifiers 0.4 is installed.

    "environment": "verifiers",
    "environment_args": {"id": "my-taskset", "args": {"num_tasks": 10}, "format": "hermes"}

`id` is a taskset as verifiers loads one (`vf.load_taskset`: an installed top-level package exporting its
`vf.Taskset` subclass in `__all__`, or a built-in taskset), `args` its `TasksetConfig` fields. Each episode is one
verifiers rollout (`verifiers.v1.rollout.Rollout`) of a task: its Task's `setup`, its tool servers (the
taskset's `toolsets`, served once per process, and the task's, served per rollout, as MCP servers in subprocesses),
its `@vf.stop` conditions, and its scoring: the reward is the trace's (`@vf.reward` scores times their weights,
summed), each reward's score and each `@vf.metric` a metric. The rollout runs in the adapter's harness
(`PolicyHarness`, verifiers_policy.py: the chat loop of verifiers' `null` harness, in process), whose model calls
reach the policy through verifiers' interception server (which records the trace) and the adapter's endpoint.

The task of a row: a row with an `example_id` column plays the taskset's task at that position; any other row
makes a task of the taskset's Task class from the row: its `input` as the prompt and the row's columns named like
fields of the task's data class (`answer`, ...), validated by that class. Refused at load, in one line: a task
that needs a container (rollouts here run in a subprocess runtime); a taskset whose environment judges an
episode's traces together (an `Env` overriding `finalize()`: a group-level reward, as best-of-n's) or plays more
than one agent; a GRPO group is several episodes here, each scored on its own.
"""
from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import json
import logging
from typing import Any, Dict, List, Mapping, Optional

from alignment.envs.adapters.common import numbers, require
from alignment.envs.adapters.policy_turns import PolicyTurns
from alignment.envs.event_loop import start_task
from alignment.envs.tool_env import prompt_messages

_EPISODES = itertools.count()


def _one_line(err: Exception) -> str:
    errors = getattr(err, "errors", None)
    if callable(errors):  # a pydantic ValidationError: its first error, with where it is
        first = errors()[0]
        return f"{'.'.join(map(str, first.get('loc') or ())) or 'value'}: {first.get('msg')}"
    return (str(err).strip().splitlines() or [""])[0]


@functools.lru_cache(maxsize=None)
def _loaded(taskset_id: str, args_json: str) -> "_Taskset":
    """One loaded taskset per (id, args) per process, serving every episode (as a verifiers environment does)."""
    vf = require("verifiers.v1", "verifiers", "verifiers")
    where = f"environment 'verifiers' {taskset_id!r}"
    try:
        env_class = vf.environment_class(taskset_id)
        config = vf.taskset_config_type(taskset_id).model_validate({**json.loads(args_json), "id": taskset_id})
        taskset = vf.load_taskset(config)
    except Exception as err:  # noqa: BLE001 - the taskset's own loading code: one line naming it
        raise ValueError(f"{where}: loading the taskset failed: {type(err).__name__}: {_one_line(err)}") from None
    if env_class is not vf.SingleAgentEnv:
        if env_class.finalize is not vf.Env.finalize:
            raise ValueError(f"{where}: its environment {env_class.__name__} judges an episode's traces together "
                             f"(finalize(), a group-level reward); only per-trace rewards are supported")
        raise ValueError(f"{where}: its environment {env_class.__name__} is not the single-agent one; an episode "
                         f"here is one agent's rollout")
    task_class = type(taskset).task_type()
    if task_class.NEEDS_CONTAINER:
        raise ValueError(f"{where}: its task {task_class.__name__} needs a container (NEEDS_CONTAINER); rollouts here "
                         f"run in a subprocess runtime")
    for name in ("httpx", "httpx2", "aiohttp.access", "verifiers"):  # else a log line per model call and per rollout
        if logging.getLogger(name).level == logging.NOTSET:
            logging.getLogger(name).setLevel(logging.WARNING)
    return _Taskset(taskset)


class _Taskset:
    """A loaded taskset and, from its first episode until the process exits, what serves its rollouts: the
    policy endpoint and the taskset's shared tool servers (one task on the environments' event loop holds them)."""

    def __init__(self, taskset):
        self.taskset = taskset
        self.task_class = type(taskset).task_type()
        self.has_tools = bool(type(taskset).toolsets(taskset.config) or
                              self.task_class.toolsets(taskset.config.task))
        self.ready: Optional[asyncio.Future] = None
        self.tasks: Optional[List[Any]] = None

    async def serving(self):
        loop = asyncio.get_running_loop()
        if self.ready is None or self.ready.get_loop() is not loop:  # first use (in this process)
            self.ready = loop.create_future()
            start_task(self._serve(self.ready))
        await asyncio.shield(self.ready)
        return self

    async def _serve(self, ready: asyncio.Future) -> None:
        from verifiers.v1.mcp import serve_shared

        from alignment.envs.adapters.verifiers_policy import PolicyEndpoint

        endpoint = PolicyEndpoint()
        toolsets = type(self.taskset).toolsets(self.taskset.config)
        try:
            await endpoint.start()
            async with (serve_shared(toolsets) if toolsets else contextlib.nullcontext({})) as shared:
                self.endpoint, self.shared = endpoint, shared
                ready.set_result(None)
                await asyncio.Event().wait()  # until the loop's shutdown cancels it
        except Exception as err:  # noqa: BLE001 - reported by the episode that waits for it
            if not ready.done():
                ready.set_exception(ValueError(f"serving the taskset's tools failed: {type(err).__name__}: "
                                               f"{_one_line(err)}"))
        finally:
            await endpoint.close()

    def task_at(self, position: int):
        """The taskset's task at `position` (an infinite taskset's first tasks, made again for each such row)."""
        if self.taskset.bounded and self.tasks is None:
            self.tasks = list(self.taskset)
        tasks = self.tasks if self.taskset.bounded else list(self.taskset.take(max(position, 0) + 1))
        if not 0 <= position < len(tasks):
            raise ValueError(f"row key 'example_id' is {position}; the taskset has {len(tasks)} tasks")
        return tasks[position]


class VerifiersV1Environment(PolicyTurns):
    """Built by VerifiersEnvironment ("verifiers") when verifiers 0.4 is installed."""

    ID = "a verifiers 0.4 taskset, as for verifiers.v1.load_taskset"

    def _load(self, args_json: str) -> None:
        self.loaded = _loaded(self.id, args_json)
        self.has_tools = self.loaded.has_tools

    def task(self, row: Mapping[str, Any]):
        loaded = self.loaded
        if row.get("example_id") is not None:
            return loaded.task_at(int(row["example_id"]))
        data_class = loaded.task_class.data_type()
        messages = prompt_messages(row.get("input"))
        fields = {key: value for key, value in row.items() if key in data_class.model_fields and key != "idx"}
        fields["prompt"] = messages[0]["content"] if len(messages) == 1 else messages
        try:
            data = data_class.model_validate({**fields, "idx": 0})
        except Exception as err:  # noqa: BLE001 - pydantic's ValidationError: one line naming the field
            raise ValueError(f"the row does not make a {data_class.__name__}: {_one_line(err)}") from None
        task = loaded.task_class(data, loaded.taskset.config.task)
        return task.with_system_prompt(loaded.taskset.system_prompt) if loaded.taskset.system_prompt else task

    async def _start(self, row: Mapping[str, Any]):
        task = self.task(row)
        loaded = await self.loaded.serving()
        name = f"episode-{next(_EPISODES)}"
        calls = loaded.endpoint.open(name, self.format)
        return calls, start_task(_play(loaded, task, name))

    def _outcome(self, trace) -> tuple:
        if not trace.ok:
            error = trace.errors[-1] if trace.errors else None
            raise RuntimeError(f"the verifiers rollout failed: {error.type}: {_one_line(Exception(error.message))}"
                               if error is not None else "the verifiers rollout failed")
        metrics: Dict[str, float] = {name: reward.score for name, reward in trace.rewards.items() if reward}
        metrics.update(numbers(trace.metrics))
        metrics["num_turns"] = float(trace.num_turns)
        return float(trace.reward), metrics


async def _play(loaded: _Taskset, task, name: str):
    """One rollout of the task, scored (its trace). A function, not a method: the task must not refer to the
    adapter, whose collection (when the rollout drops an episode cut by max_turns) is what cancels it."""
    import verifiers.v1 as vf
    from verifiers.v1.rollout import Rollout, RolloutTimeouts
    from verifiers.v1.session import RolloutLimits
    from verifiers.v1.utils.aio import run_shielded

    from alignment.envs.adapters.verifiers_policy import PolicyHarness

    ctx = vf.ModelContext(model=name, client=vf.EvalClientConfig(base_url=loaded.endpoint.base_url,
                                                                 api_key_var="ALIGNMENT_POLICY_KEY"))
    agent = vf.AgentConfig(model=name, runtime=vf.SubprocessConfig())
    run = Rollout(task=task, agent_config=agent, harness=PolicyHarness(vf.HarnessConfig(id="alignment-policy")),
                  ctx=ctx, runtime_config=agent.runtime, timeouts=RolloutTimeouts(), limits=RolloutLimits(),
                  shared_tools=dict(loaded.shared))
    try:
        if await run.open():
            await run.step()
            if run.ok:
                run.trace.stop("agent_completed")
        return await run.close()
    except BaseException:
        await run_shielded(run.abort())  # cancelled (the episode was left) or failed: its runtime torn down
        raise
    finally:
        loaded.endpoint.close_episode(name)
