"""Agent programs as the rollout (key `agent`): an ordinary program that calls an OpenAI-compatible endpoint, run
once per episode, each of its calls sampled by the policy being trained through the gateway (alignment/gateway).

    def play(base_url, api_key, row):          # examples/openai_agent/ for a whole one
        client = openai.OpenAI(base_url=base_url, api_key=api_key)
        ...                                    # as many calls, tools and turns as it likes
        return reward                          # or None: 0, the reward functions judge the final answer

Each episode gets a session of its own (its base URL names it) and the row's sampling seed, so the episode's
tokens depend on the row alone, as an Environment's do. The session's calls become the episode's trajectory
(gateway/backend.py): when the agent edits its history, the new sample replaces the old one, and the old one is
counted in `agent/prefix_breaks` and kept in the ledger's `calls`. An agent that raises or outlives
`agent_timeout` fails its episode: it is played again in a fresh session with a seed of its own up to
`episode_retries` times, and one still failing drops its group (fault_policy.py; counted in
`rollout/failed_episodes`, its first error printed once); above `max_agent_error_fraction` of a step's episodes
failing the run stops with one line naming the agent.
"""
from __future__ import annotations

import secrets
from typing import Dict, List

import numpy as np
import paddle

from alignment.data import import_function
from alignment.envs import EnvironmentFailure
from alignment.envs.formats import tool_call_format
from alignment.gateway.episodes import AgentEpisode, CurrentGateway, capped_sampler, play_episodes
from alignment.ppo.rollout.fault_policy import attempt_seed, play_with_retries
from alignment.ppo.rollout.episodes import (environment_row, episode_metrics, episode_record, episode_rollout,
                                            prompt_only, routing_shape)
from alignment.ppo.rollout.drafts import draft_for
from alignment.ppo.rollout.samplers import Draw, Episodes, SingleTurn


class AgentFailure(EnvironmentFailure):
    """Too many of a step's episodes failed in the agent program."""


def load_agent(spec: str):
    """The agent function `spec` names, or a ValueError naming the key."""
    return import_function(spec, "key 'agent'")


class Agents(Episodes):
    """The sampler strategy of an `agent` run (samplers.py's interface)."""

    def __init__(self, ppo, max_length: int, collate_prompts, env_args, keep_experts: bool = False, draft=None):
        super().__init__(ppo, max_length, collate_prompts, env_args, keep_experts, draft)
        self.spec, self.agent = env_args.agent, load_agent(env_args.agent)
        self.fmt = tool_call_format(env_args.environment_args.get("format", "hermes"))
        self.key = secrets.token_urlsafe(24)
        self.current, self.server = CurrentGateway(), None
        self.reported = False  # the first agent error is printed once per run
        self.rollouts = 0

    def __call__(self, actor, tokenizer, base, draw: Draw):
        from alignment.gateway.app import GatewayServer, create_app  # FastAPI: the `server` extra, agent runs only
        from alignment.gateway.backend import Gateway

        config = self.config(base, draw)
        temperature = draw.log_prob_temperature or 1.0
        rows = [environment_row(item) for item in draw.items for _ in range(draw.n)]
        seeds = None if draw.greedy else [[draw.seed, p * draw.n + s] for p in (
            range(len(draw.items)) if draw.positions is None else draw.positions) for s in range(draw.n)]
        if self.server is None:
            self.server = GatewayServer(create_app(self.current, self.key))
        self.rollouts += 1
        budget = self.env_args.max_trajectory_tokens or self.max_length
        sessions = {}
        actor.eval()
        draft = draft_for(self.draft, actor)  # the gateway's engine speculates with it (drafts.py)

        def play(indices: List[int], attempt: int) -> List[AgentEpisode]:  # fresh sessions every attempt
            gateway = Gateway(actor, tokenizer, len(indices), self.max_length, self.fmt,
                              capped_sampler(config, temperature), draft=draft)
            self.current.gateway = gateway
            rngs = [None if seeds is None else np.random.default_rng(attempt_seed(seeds[i], attempt))
                    for i in indices]
            names = [f"r{self.rollouts}-{i}" + (f"-retry{attempt}" if attempt else "") for i in indices]
            episodes = play_episodes(gateway, self.server.base_url, self.key, self.agent, [rows[i] for i in indices],
                                     names, rngs, budget, self.env_args.agent_timeout)
            for episode in episodes:
                sessions[episode.session_id] = gateway.sessions[episode.session_id]
                if episode.error is None and not sessions[episode.session_id].samples:
                    episode.error = "made no call"
            return episodes

        episodes, retries = play_with_retries(play, len(rows), self.env_args.episode_retries)
        return self._rollout(episodes, retries, sessions, draw, tokenizer,
                             routing_shape(actor) if self.keep_experts else None)

    def _rollout(self, episodes: List[AgentEpisode], retries: List[int], sessions: dict, draw: Draw, tokenizer,
                 experts_shape=None):
        failed = [e for e in episodes if e.error is not None]
        if failed and not self.reported:
            print(f"agent {self.spec!r}: episode {failed[0].session_id} failed: {failed[0].error} (later failures "
                  f"are counted in rollout/failed_episodes)", flush=True)
            self.reported = True
        if len(failed) > self.env_args.max_agent_error_fraction * len(episodes):
            raise AgentFailure(f"agent {self.spec!r}: {len(failed)} of {len(episodes)} episodes failed (key "
                               f"'max_agent_error_fraction' {self.env_args.max_agent_error_fraction:g}); the first: "
                               f"{failed[0].error}")
        trajectories, records = [], []
        items = [item for item in draw.items for _ in range(draw.n)]
        for episode, item in zip(episodes, items):
            session = sessions[episode.session_id]
            trajectory = session.sample if session.samples else prompt_only(item)
            if experts_shape is not None and session.samples:  # the live sample: its sequence fed its tokens
                trajectory.experts = list(session.seq.experts)
            if episode.error is None and trajectory.turn_rewards:
                trajectory.turn_rewards[-1] = episode.reward
            trajectory.error = episode.error  # the trainer drops its group (fault_policy.py)
            trajectories.append(trajectory)
            records.append({"calls": session.calls, "prefix_breaks": session.prefix_breaks,
                            "agent_error": episode.error})
        rollout = episode_rollout(trajectories, items, tokenizer.pad_token_id, draw.log_prob_temperature is not None,
                                  self.env_args.env_reward_weight if self.env_args.per_turn_rewards else None,
                                  experts_shape)
        for episode, extra, count in zip(rollout.episodes, records, retries):
            episode.update(extra, retries=count)
        return rollout

    @staticmethod
    def metrics(rollout) -> Dict[str, float]:
        """Episodes' env/* means, agent/prefix_breaks and agent/calls (means per episode); the failed episodes are
        counted by the trainer (rollout/failed_episodes, before their groups are dropped)."""
        episodes = rollout.episodes
        out = Episodes.metrics(rollout)
        out["agent/prefix_breaks"] = float(np.mean([e["prefix_breaks"] for e in episodes]))
        out["agent/calls"] = float(np.mean([len(e["calls"]) for e in episodes]))
        return out


def make_sampler(ppo, max_length: int, collate_prompts, env_args=None, keep_experts: bool = False, draft=None):
    """The run's sampler strategy: samplers.SingleTurn, samplers.Episodes (an environment's) or Agents (an agent
    program's, through the gateway); keep_experts: the rollouts carry an MoE sampler's expert choice for each token
    (routing_replay.py); draft: the draft model they speculate with (drafts.py; None: none)."""
    if env_args is not None and env_args.agent is not None:
        return Agents(ppo, max_length, collate_prompts, env_args, keep_experts, draft)
    if env_args is not None and env_args.multi_turn:
        return Episodes(ppo, max_length, collate_prompts, env_args, keep_experts, draft)
    return SingleTurn(ppo, max_length, collate_prompts, keep_experts, draft)
