"""What the verifiers routes share (verifiers_env.py: 0.3, verifiers_v1.py: 0.4): an episode that is verifiers' own
rollout, each of its model calls answered by the policy's next turn. Pure Python (no paddle, no verifiers)."""
from __future__ import annotations

import asyncio
import json
from typing import Any, Dict, List, Mapping, Optional

from alignment.envs.base import Environment, Message, StepResult
from alignment.envs.event_loop import cancel_soon
from alignment.envs.formats import tool_call_format


def as_message(message: Any) -> Message:
    """A verifiers message (pydantic or dict) as {"role", "content"} text."""
    data = message.model_dump() if hasattr(message, "model_dump") else dict(message)
    content = data.get("content") or ""
    if isinstance(content, list):
        content = "".join(part.get("text", "") for part in content if isinstance(part, Mapping))
    role = data.get("role")
    return {"role": role if role in ("system", "user", "assistant", "tool") else "user", "content": str(content)}


class PolicyTurns(Environment):
    """An episode that is a library's own rollout, its model calls answered by the policy's turns. A subclass
    loads its environment (`_load`), starts the rollout (`_start(row)`: the queue of its model calls, each (prompt
    messages, tool schemas, future of the answer), and the task playing it) and reads its outcome
    (`_outcome(result)`: reward and metrics)."""

    episode: Optional[asyncio.Task] = None
    has_tools = False  # whether the environment offers tools

    ID = ""  # what environment_args' `id` names (said when it is missing)

    def __init__(self, id: str = "", args: Optional[Mapping[str, Any]] = None, format: str = "hermes"):
        if not id:
            raise ValueError(f"environment 'verifiers': environment_args needs 'id' ({self.ID})")
        self.id = id
        self.format = tool_call_format(format)
        self.tool_schemas: List[Dict[str, Any]] = []  # shown to the policy (alignment-check-env reads them)
        self._load(json.dumps(dict(args or {}), sort_keys=True))
        self.stop_strings = self.format.stop_strings if self.has_tools else ()  # a call's close also ends a turn

    def _load(self, args_json: str) -> None:
        """Load the environment `id` names with `args` (once per process) and set `has_tools`."""
        raise NotImplementedError

    @property
    def env_name(self) -> str:
        return f"verifiers[{self.id}]"

    async def _start(self, row: Mapping[str, Any]):
        raise NotImplementedError

    def _outcome(self, result: Any):
        raise NotImplementedError

    async def reset(self, row: Mapping[str, Any]) -> List[Message]:
        self._stop()
        self.calls, self.episode = await self._start(row)
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
        reward, metrics = self._outcome(self.episode.result())
        return StepResult([], reward, True, metrics)

    async def _next_call(self):
        """The rollout's next model call (prompt, tools, answer future), or None when the rollout has ended."""
        getter = asyncio.ensure_future(self.calls.get())
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
