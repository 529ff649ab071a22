"""The policies an evaluation samples from: a checkpoint (a stage's output or an export) decoded by the one decode
engine, and any OpenAI-compatible chat endpoint (`alignment-serve` or another server).

Every sample has its own seed ([run seed, item index, sample index]): the local engine draws that sample's
uniform numbers from it, so a sample's tokens do not depend on which others share its batch, and an endpoint gets
it as the request's `seed`. Batches are fixed runs of items, the engine's capacity is the task's, so a resumed run
decodes every batch exactly as an uninterrupted one does.
"""
from __future__ import annotations

import hashlib
import os
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

from alignment.inputs import InputError


class EndpointError(RuntimeError):
    """The endpoint refused or stopped answering: one line, the run stops, a rerun resumes."""


def resolve_model_dir(path: str) -> str:
    """A directory with config.json: the path itself, an export's hf/, a stage output's model/ or an RL run's (or
    its checkpoint's) policy/."""
    for candidate in (path, *(os.path.join(path, sub) for sub in ("hf", "model", "policy"))):
        if os.path.isfile(os.path.join(candidate, "config.json")):
            return candidate
    if not os.path.exists(path):
        raise InputError(f"--model {path}: no such checkpoint directory")
    raise InputError(f"--model {path}: no config.json in it, in its hf/ (an export), model/ (a stage's output) or "
                     f"policy/ (an RL run or checkpoint)")


def weights_digest(model_dir: str) -> str:
    """sha256 over the weight files' names and bytes: what a resumed run checks it is evaluating again."""
    digest = hashlib.sha256()
    for name in sorted(os.listdir(model_dir)):
        if name.endswith((".safetensors", ".pdparams")):
            digest.update(name.encode("utf-8"))
            with open(os.path.join(model_dir, name), "rb") as f:
                for block in iter(lambda: f.read(1 << 20), b""):
                    digest.update(block)
    return digest.hexdigest()


def sample_seed(seed: int, item: int, sample: int) -> List[int]:
    return [seed, item, sample]


class LocalPolicy:
    """A LlamaForCausalLM and its tokenizer, loaded from `model_dir` or given (the trainer's actor, inline)."""

    def __init__(self, model_dir: Optional[str] = None, model=None, tokenizer=None):
        from alignment.models import LlamaForCausalLM, Tokenizer

        if model is None:
            model_dir = resolve_model_dir(model_dir)
            model, tokenizer = LlamaForCausalLM.from_pretrained(model_dir), Tokenizer.from_pretrained(model_dir)
        self.model, self.tokenizer, self.model_dir = model, tokenizer, model_dir
        self.encoded: Dict[str, List[int]] = {}  # a prompt's ids, encoded once for its n samples and the width

    def describe(self) -> Dict[str, Any]:
        if self.model_dir is None:
            return {"policy": "in-process model"}
        return {"policy": os.path.abspath(self.model_dir), "weights_sha256": weights_digest(self.model_dir)}

    def generation_config(self, max_new_tokens: int, temperature: float, top_p: float):
        from alignment.models import GenerationConfig

        return GenerationConfig(max_new_tokens=max_new_tokens, do_sample=temperature > 0,
                                temperature=temperature if temperature > 0 else 1.0, top_p=top_p,
                                eos_token_id=self.model.config.eos_token_ids or self.tokenizer.eos_token_id,
                                pad_token_id=self.tokenizer.pad_token_id)

    def prompt_ids(self, row: Dict[str, Any]) -> List[int]:
        """The prompt as training encodes it (PromptOnlyDataset: the chat template, special tokens)."""
        from alignment.data.tokenized import format_prompt

        key = repr((row.get("dialogue"), row["input"]))  # what format_prompt reads
        if key not in self.encoded:
            self.encoded[key] = self.tokenizer.encode(format_prompt(self.tokenizer, row), add_special_tokens=True)
        return self.encoded[key]

    def capacity(self, task, rows: Sequence[Dict[str, Any]], budget: int) -> int:
        """The decode engine's width for every batch of a run: the longest prompt (an episode's first messages,
        from a reset of the task's environment) plus the response budget."""
        if task.environment is None:
            return max(len(self.prompt_ids(row)) for row in rows) + budget
        from alignment.envs.base import checked_reset, make_environment
        from alignment.envs.chat import prompt_text
        from alignment.envs.multiturn import environment_row

        env = make_environment(task.environment, **task.environment_args)
        first = [checked_reset(env, environment_row({"row": row})) for row in rows]
        return max(len(self.tokenizer.encode(prompt_text(self.tokenizer, m), add_special_tokens=True))
                   for m in first) + budget

    def complete(self, rows: Sequence[Dict[str, Any]], seeds: Sequence[List[int]], config, capacity: int,
                 slots: int) -> List[Tuple[str, int]]:
        """(text, new tokens) of one sample per row, decoded together in an engine of `slots` slots; the text
        is decoded as training decodes a response (special tokens skipped)."""
        import paddle

        from alignment.models.engine import DecodeEngine, DecodeSequence

        self.model.eval()
        with paddle.no_grad():
            engine = DecodeEngine(self.model, slots, capacity)
            seqs = []
            for row, seed in zip(rows, seeds):
                ids = self.prompt_ids(row)
                seqs.append(DecodeSequence(ids, config, len(ids) + config.max_new_tokens,
                                           rng=np.random.default_rng(seed) if config.do_sample else None,
                                           log_prob_temperature=None))
                engine.add(seqs[-1])
            while engine.busy():
                engine.step()
        return [(self.tokenizer.decode(seq.turn), len(seq.turn)) for seq in seqs]

    def episodes(self, task, rows: Sequence[Dict[str, Any]], seeds: Sequence[List[int]], config,
                 capacity: int) -> List[Tuple[str, int, float]]:
        """(final assistant text, tokens after the prompt, environment reward) of one episode per row, played in
        the task's environment by envs/multiturn.py as training plays them."""
        from alignment.envs.base import make_environment
        from alignment.envs.multiturn import multi_turn_rollout
        from alignment.envs.multiturn import environment_row, final_answer

        envs = [make_environment(task.environment, **task.environment_args) for _ in rows]
        self.model.eval()
        budget = task.max_episode_tokens or task.max_new_tokens * task.max_turns
        trajectories = multi_turn_rollout(self.model, self.tokenizer, envs,
                                          [environment_row({"row": r}) for r in rows], config, task.max_turns,
                                          budget, 1.0, capacity, row_seeds=seeds if config.do_sample else None)
        return [(final_answer(t), len(t.input_ids) - t.prompt_len, t.reward) for t in trajectories]

    def agent_episodes(self, task, rows: Sequence[Dict[str, Any]], seeds: Sequence[List[int]], config,
                       capacity: int) -> List[Tuple[str, int, float, Optional[str]]]:
        """(final assistant text, tokens after the first prompt, the agent's reward, its error or None) of one
        episode per row: the task's agent program plays the row against the gateway over this model
        (gateway/episodes.py, as training plays it), each session sampling from its row's seed. A failed episode's
        agent reward is 0."""
        import secrets

        from alignment.data import import_function
        from alignment.envs.formats import tool_call_format
        from alignment.envs.multiturn import environment_row, final_answer
        from alignment.gateway.app import GatewayServer, create_app
        from alignment.gateway.backend import Gateway
        from alignment.gateway.episodes import CurrentGateway, capped_sampler, play_episodes

        agent = import_function(task.agent, "the task's agent")
        fmt = tool_call_format(task.environment_args.get("format", "hermes"))

        self.model.eval()
        current, key = CurrentGateway(), secrets.token_urlsafe(24)
        current.gateway = Gateway(self.model, self.tokenizer, len(rows), capacity, fmt, capped_sampler(config, 1.0))
        server = GatewayServer(create_app(current, key))
        try:
            budget = task.max_episode_tokens or task.max_new_tokens * task.max_turns
            rngs = [np.random.default_rng(seed) if config.do_sample else None for seed in seeds]
            episodes = play_episodes(current.gateway, server.base_url, key, agent,
                                     [environment_row({"row": r}) for r in rows],
                                     [f"e{i}" for i in range(len(rows))], rngs, budget, task.agent_timeout)
        finally:
            server.stop()
        out = []
        for episode in episodes:
            sample = current.gateway.sessions[episode.session_id].sample
            text, tokens = ("", 0) if sample is None else (final_answer(sample),
                                                           len(sample.input_ids) - sample.prompt_len)
            out.append((text, tokens, episode.reward or 0.0, episode.error))
        return out
