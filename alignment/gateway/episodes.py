"""Agent programs played through the gateway: each episode an ordinary program `agent(base_url, api_key, row)` in
a thread of its own, calling the session URL the gateway serves, while this thread pumps the decode engine. Training
(ppo/rollout/agent_programs.py) turns the sessions into a rollout; the evaluation harness scores their final answers.

An agent returns a finite number (its reward) or None (0: the reward functions judge the final answer); an agent
that raises, returns anything else or outlives `timeout` fails its episode (`error` says how).
"""
from __future__ import annotations

import dataclasses
import inspect
import numbers
import threading
import time
from typing import Callable, List, Optional

import numpy as np

from alignment.envs.event_loop import run_awaitable


class CurrentGateway:
    """What the one server of a run forwards to: the gateway (engine) of the current rollout or batch."""
    gateway = None

    def __getattr__(self, name):
        return getattr(self.gateway, name)


@dataclasses.dataclass
class AgentEpisode:
    row: dict
    session_id: str
    thread: Optional[threading.Thread] = None
    reward: Optional[float] = None
    error: Optional[str] = None
    started: float = 0.0
    done: bool = False


def capped_sampler(config, temperature: float) -> Callable:
    """The gateway's sampler for a run that imposes its sampling (`config`, a GenerationConfig): an agent's call may
    only shorten a turn (its max_tokens), never change how tokens are drawn."""
    def sampler(request):
        cap = min(config.max_new_tokens, request.max_tokens or config.max_new_tokens)
        return (config if cap == config.max_new_tokens else dataclasses.replace(config, max_new_tokens=cap),
                temperature)
    return sampler


def play_episodes(gateway, base_url: str, key: str, agent: Callable, rows: List[dict], session_ids: List[str],
                  rngs: List[Optional[np.random.Generator]], budget: int, timeout: float) -> List[AgentEpisode]:
    """Open a session per row (its sampler's rng, `budget` tokens after the first prompt), run the agent on each
    in its own thread and pump the gateway until every episode is over; the sessions are closed after."""
    episodes = []
    for row, session_id, rng in zip(rows, session_ids, rngs):
        gateway.open_session(session_id, rng, budget)
        episodes.append(AgentEpisode(row, session_id))
    for episode in episodes:
        url = f"{base_url}/sessions/{episode.session_id}/v1"
        episode.started = time.monotonic()
        episode.thread = threading.Thread(target=play_one, args=(agent, episode, url, key), daemon=True,
                                          name=f"agent-{episode.session_id}")
        episode.thread.start()
    gateway.pump(lambda: _all_over(episodes, gateway, timeout))
    for episode in episodes:
        gateway.close_session(gateway.sessions[episode.session_id], "the episode is over")
    return episodes


def play_one(agent: Callable, episode: AgentEpisode, url: str, key: str) -> None:
    """Run the agent on the episode's row against `url`; its reward or its error lands in the episode."""
    try:
        result = agent(url, key, dict(episode.row))
        if inspect.isawaitable(result):
            result = run_awaitable(result)
        if result is not None and (isinstance(result, bool) or not isinstance(result, numbers.Real)
                                   or not np.isfinite(float(result))):
            raise TypeError(f"returned {result!r}; it must return a finite number or None")
        episode.reward = 0.0 if result is None else float(result)
    except Exception as err:  # noqa: BLE001 - the user's program: its episode fails, the caller counts it
        episode.error = " ".join(f"{type(err).__name__}: {err}".split())[:500]
    episode.done = True


def _all_over(episodes: List[AgentEpisode], gateway, timeout: float) -> bool:
    now = time.monotonic()
    for episode in episodes:
        if not episode.done and now - episode.started > timeout:
            episode.error, episode.done = f"timed out after {timeout:g} s", True
            gateway.close_session(gateway.sessions[episode.session_id], "the agent timed out")
    return all(episode.done for episode in episodes)
