"""The policy's side of a verifiers 0.4 rollout (verifiers_v1.py): a model endpoint whose answers are the policy's
turns, and the harness that runs the rollout's chat loop in this process. Imported only when verifiers 0.4 is.

verifiers 0.4 runs a rollout as a harness program whose model calls pass through its interception server (which
records them on the trace) to a model endpoint. The endpoint here is `PolicyEndpoint`: a `POST
/v1/chat/completions` whose `model` names an episode waits until that episode's `step(text)` gives the policy's
turn, and answers with it (the calls the tool-call format parses from the text as `tool_calls`). The harness is
`PolicyHarness`, the chat loop of verifiers' own tool-less `null` harness run in process (that harness installs its
program with `uv`, which needs the network): it lists the rollout's MCP tool servers, asks the model, calls the
tools its answer names, and ends at an answer that calls none.
"""
from __future__ import annotations

import asyncio
import json
import time
from contextlib import AsyncExitStack
from typing import Any, Dict, List, Optional, Set

import verifiers.v1 as vf
from aiohttp import web
from openai import APIStatusError, AsyncOpenAI
from verifiers.v1.dialects.chat import message_to_wire
from verifiers.v1.harnesses.utils.mcp import call_mcp, connect_mcp
from verifiers.v1.runtimes import ProgramResult

from alignment.envs.adapters.policy_turns import as_message


class _Episode:
    def __init__(self, tool_format):
        self.format = tool_format
        self.calls: asyncio.Queue = asyncio.Queue()  # (prompt messages, tool schemas, future of the policy's text)
        self.waiting: Set[asyncio.Future] = set()
        self.count = 0


class PolicyEndpoint:
    """An OpenAI-compatible chat endpoint on 127.0.0.1 answered by the episodes `open` registered."""

    def __init__(self):
        self.episodes: Dict[str, _Episode] = {}
        self.runner: Optional[web.AppRunner] = None
        self.base_url = ""

    async def start(self) -> None:
        app = web.Application(client_max_size=1 << 30)
        app.router.add_post("/v1/chat/completions", self._complete)
        self.runner = web.AppRunner(app, access_log=None)
        await self.runner.setup()
        await web.TCPSite(self.runner, "127.0.0.1", 0).start()
        self.base_url = f"http://127.0.0.1:{self.runner.addresses[0][1]}/v1"

    async def close(self) -> None:
        if self.runner is not None:
            await self.runner.cleanup()

    def open(self, name: str, tool_format) -> asyncio.Queue:
        self.episodes[name] = _Episode(tool_format)
        return self.episodes[name].calls

    def close_episode(self, name: str) -> None:
        """The episode is over: a model call still waiting for its turn is answered 409 (its rollout is gone)."""
        episode = self.episodes.pop(name, None)
        for answer in episode.waiting if episode is not None else ():
            answer.cancel()

    async def _complete(self, request: web.Request) -> web.Response:
        body = await request.json()
        episode = self.episodes.get(body.get("model"))
        if episode is None:
            return web.json_response({"error": {"message": f"no episode {body.get('model')!r}"}}, status=404)
        answer = asyncio.get_running_loop().create_future()
        episode.waiting.add(answer)
        prompt = [as_message(message) for message in body.get("messages") or []]
        await episode.calls.put((prompt, body.get("tools") or [], answer))
        try:
            text = await asyncio.shield(answer)
        except asyncio.CancelledError:
            if not answer.cancelled():
                raise  # this handler was cancelled, not the episode
            return web.json_response({"error": {"message": "the episode ended"}}, status=409)
        finally:
            episode.waiting.discard(answer)
        episode.count += 1
        return web.json_response(_completion(text, episode, body.get("model")))


def _completion(text: str, episode: _Episode, model: str) -> Dict[str, Any]:
    calls = [{"id": f"call_{episode.count}_{i}", "type": "function",
              "function": {"name": call.name, "arguments": json.dumps(call.arguments)}}
             for i, call in enumerate(episode.format.parse(text)) if call.error is None]
    message = {"role": "assistant", "content": text, **({"tool_calls": calls} if calls else {})}
    return {"id": f"policy-{episode.count}", "object": "chat.completion", "created": int(time.time()), "model": model,
            "choices": [{"index": 0, "message": message, "finish_reason": "tool_calls" if calls else "stop"}],
            "usage": {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0}}


class PolicyHarness(vf.Harness[vf.HarnessConfig]):
    """The rollout's chat loop in process: model calls to the interception `endpoint`, tools over MCP."""

    APPENDS_SYSTEM_PROMPT = True
    SUPPORTS_MCP = True
    EXECUTES_CODE = False
    NEEDS_CONTAINER = False

    async def launch(self, ctx, trace, runtime, endpoint, secret, mcp_urls, data, tool_interception_url=None):
        system, prompt = self.resolve_prompt(data)
        messages: List[Dict[str, Any]] = [{"role": "system", "content": system}] if system else []
        messages += ([{"role": "user", "content": prompt}] if isinstance(prompt, str) else
                     [message_to_wire(message) for message in prompt or []])
        model = AsyncOpenAI(base_url=endpoint, api_key=secret, max_retries=0)
        servers = {name: {"url": url, "timeout": self.config.tool_timeout} for name, url in mcp_urls.items()}
        try:
            async with AsyncExitStack() as stack:
                tools, dispatch, connections = await connect_mcp({"mcpServers": servers}, stack)
                while True:
                    completion = await model.chat.completions.create(
                        model=ctx.model, messages=messages, **({"tools": tools} if tools else {}))
                    message = completion.choices[0].message
                    messages.append(message.model_dump(exclude_none=True))
                    if not message.tool_calls:
                        break
                    for call in message.tool_calls:
                        content = await _tool_result(call, dispatch, connections)
                        messages.append({"role": "tool", "tool_call_id": call.id, "content": content})
        except APIStatusError:
            if trace.stop_condition is None:  # a @stop or a limit refusing a turn ends the rollout; else it failed
                raise
        finally:
            await model.close()
        return ProgramResult(exit_code=0, stdout="", stderr="")


async def _tool_result(call, dispatch, connections):
    """The tool's result, or an error the model reads (as verifiers' chat program words it)."""
    try:
        arguments = json.loads(call.function.arguments or "{}")
    except json.JSONDecodeError as err:
        return f"error: invalid JSON in tool arguments ({err}); resend the call with valid JSON"
    if not isinstance(arguments, dict):
        return f"error: tool arguments must be a JSON object, got {type(arguments).__name__}; resend as an object"
    if call.function.name not in dispatch:
        return f"error: unknown tool {call.function.name!r}"
    return await call_mcp(connections, dispatch, call.function.name, arguments)
