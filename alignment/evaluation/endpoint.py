"""An OpenAI-compatible chat endpoint as an evaluation's policy (`alignment-eval --endpoint URL`): one request per
sample with the sample's seed; episodes play the task's environment turn by turn, the endpoint answering each
user/tool message. A refused or dead endpoint is an EndpointError (one line); the batches finished before it stay
on disk and a rerun goes on from there."""
from __future__ import annotations

import concurrent.futures as cf
from typing import Any, Dict, List, Sequence

from alignment.evaluation.policies import EndpointError
from alignment.inputs import InputError


def chat_messages(turns) -> List[Dict[str, str]]:
    """A prompt string or an alternating user/assistant list of turns -> chat messages (as the tokenizer makes)."""
    turns = [turns] if isinstance(turns, str) else list(turns)
    return [{"role": "user" if i % 2 == 0 else "assistant", "content": text} for i, text in enumerate(turns)]


class EndpointPolicy:
    def __init__(self, base_url: str, model: str = "", api_key: str = "none", timeout: float = 300.0):
        import httpx

        self.base = base_url.rstrip("/")
        self.url = self.base + "/chat/completions"
        self.model, self.api_key = model, api_key
        self.client = httpx.Client(timeout=timeout, headers={"Authorization": f"Bearer {api_key}"})

    def check(self) -> None:
        """Refuse an endpoint that does not answer before any work (InputError: exit 2)."""
        import httpx

        try:
            self.client.get(self.base + "/models")
        except httpx.HTTPError as err:
            raise InputError(f"--endpoint {self.base}: no answer ({type(err).__name__})") from None

    def describe(self) -> Dict[str, Any]:
        return {"policy": "endpoint", "model": self.model, "endpoint": self.base}

    def generation_config(self, max_new_tokens: int, temperature: float, top_p: float) -> Dict[str, Any]:
        return {"max_tokens": max_new_tokens, "temperature": temperature, "top_p": top_p}

    def chat(self, messages: List[Dict[str, str]], config: Dict[str, Any], seed: Sequence[int]) -> Dict[str, Any]:
        import httpx

        body = {"model": self.model, "messages": messages, "seed": seed[0] * 1_000_003 + seed[1] * 1009 + seed[2],
                **config}
        try:
            response = self.client.post(self.url, json=body)
        except httpx.HTTPError as err:
            raise EndpointError(f"endpoint {self.url}: {type(err).__name__}: {err or 'no answer'}") from None
        if response.status_code != 200:
            raise EndpointError(f"endpoint {self.url}: HTTP {response.status_code}: {response.text[:200]}")
        try:
            choice = response.json()["choices"][0]
            return {"text": choice["message"]["content"] or "", "tokens": int(
                (response.json().get("usage") or {}).get("completion_tokens", 0))}
        except (ValueError, KeyError, IndexError, TypeError):
            raise EndpointError(f"endpoint {self.url}: not a chat completion: {response.text[:200]}") from None

    def capacity(self, task, rows, budget: int) -> int:
        return 0  # the server sizes its own cache

    def complete(self, rows: Sequence[Dict[str, Any]], seeds, config, capacity: int, slots: int) -> List[tuple]:
        """(text, completion tokens) per row; up to `slots` requests in flight (the answers do not depend on the
        order: each request carries its sample's seed)."""
        def one(row, seed):
            answer = self.chat(chat_messages(row["input"]), config, seed)
            return answer["text"], answer["tokens"]
        return self.concurrently(one, rows, seeds, slots)

    def episodes(self, task, rows: Sequence[Dict[str, Any]], seeds, config, capacity: int) -> List[tuple]:
        """Each row's episode in a new environment: (final assistant text, tokens, summed environment reward)."""
        from alignment.envs.base import checked_reset, checked_step, make_environment
        from alignment.envs.multiturn import environment_row

        def one(row, seed):
            env = make_environment(task.environment, **task.environment_args)
            messages = list(checked_reset(env, environment_row({"row": row})))
            text, tokens, reward = "", 0, 0.0
            for _ in range(task.max_turns):
                answer = self.chat(messages, config, seed)
                text, tokens = answer["text"], tokens + answer["tokens"]
                result = checked_step(env, text)
                reward += float(result.reward)
                if result.done:
                    break
                messages += [{"role": "assistant", "content": text}, *result.observation]
            return text, tokens, reward
        return self.concurrently(one, rows, seeds, len(rows))

    def agent_episodes(self, task, rows: Sequence[Dict[str, Any]], seeds, config, capacity: int) -> List[tuple]:
        """Each row played by the task's agent program against the endpoint itself: ("", 0, the agent's return
        value or 0, its error or None). The endpoint's replies are not seen here, so nothing else can judge them,
        and the agent's requests carry no per-sample seed: run-to-run equality is the server's to give."""
        from alignment.data import import_function
        from alignment.envs.multiturn import environment_row
        from alignment.gateway.episodes import AgentEpisode, play_one

        if task.reward_funcs:
            raise InputError(f"task {task.NAME!r}: an agent against --endpoint is scored by its return value alone "
                             f"(the replies pass outside the harness); give no reward functions (--reward-funcs '')")
        agent = import_function(task.agent, "the task's agent")

        def one(row, seed):
            episode = AgentEpisode(environment_row({"row": row}), "")
            play_one(agent, episode, self.base, self.api_key)
            return "", 0, episode.reward or 0.0, episode.error
        return self.concurrently(one, rows, seeds, len(rows))

    @staticmethod
    def concurrently(fn, rows, seeds, workers: int) -> List[tuple]:
        with cf.ThreadPoolExecutor(max_workers=max(1, min(workers, len(rows)))) as pool:
            return list(pool.map(fn, rows, seeds))
