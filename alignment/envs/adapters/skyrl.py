"""SkyRL-Gym environments ("skyrl-gym"): `skyrl_gym.make(id, env_config=..., extras=row)`, `init(prompt) ->
(messages, metadata)`, `step(action) -> {"observations", "reward", "done", "metadata"}`, as SkyRL's generator
drives them.

    "environment": "skyrl-gym",
    "environment_args": {"id": "gsm8k_multi_turn", "env_config": {}, "max_turns": 3}

`extras` is the row (its columns as written) plus `max_turns` when given; a row without `reward_spec` gets
`{"method": "rule", "ground_truth": <answer>}` from its answer, as SkyRL's datasets carry it. At the end of an
episode the environment's `get_metrics()` numbers join the last step's metrics.
"""
from __future__ import annotations

from typing import Any, Dict, List, Mapping, Optional

from alignment.envs.adapters.common import numbers, require
from alignment.envs.base import Environment, Message, StepResult
from alignment.envs.tool_env import prompt_messages


class SkyRLEnvironment(Environment):
    NAME = "skyrl-gym"

    def __init__(self, id: str = "", env_config: Optional[Mapping[str, Any]] = None,
                 max_turns: Optional[int] = None):
        if not id:
            raise ValueError("environment 'skyrl-gym': environment_args needs 'id', e.g. 'gsm8k'")
        self.skyrl_gym = require("skyrl_gym", "skyrl-gym", self.NAME)
        if id not in self.skyrl_gym.registry:
            raise ValueError(f"environment 'skyrl-gym': no environment {id!r} is registered; registered: "
                             f"{', '.join(sorted(self.skyrl_gym.registry))}")
        self.id, self.env_config, self.max_turns = id, dict(env_config or {}), max_turns
        self.env: Any = None

    @property
    def env_name(self) -> str:
        return f"{self.NAME}[{self.id}]"

    def reset(self, row: Mapping[str, Any]) -> List[Message]:
        extras: Dict[str, Any] = {key: value for key, value in row.items() if key != "input"}
        if "reward_spec" not in extras and row.get("answer") is not None:
            extras["reward_spec"] = {"method": "rule", "ground_truth": row["answer"]}
        extras.setdefault("extra_info", {})
        if self.max_turns is not None:
            extras["max_turns"] = self.max_turns
        if self.env is not None:
            self.env.close()
        self.env = self.skyrl_gym.make(self.id, env_config=self.env_config, extras=extras)
        messages, _metadata = self.env.init(prompt_messages(row.get("input")))
        return list(messages)

    def step(self, assistant_message: str) -> StepResult:
        outcome = self.env.step(assistant_message)
        if not isinstance(outcome, Mapping) or not {"observations", "reward", "done"} <= set(outcome):
            raise TypeError(f"step returned {type(outcome).__name__}; a SkyRL-Gym environment returns a dict with "
                            f"observations, reward and done")
        done = bool(outcome["done"])
        metrics = numbers(self.env.get_metrics()) if done else {}
        if done:
            self.env.close()
        return StepResult(list(outcome["observations"]), float(outcome["reward"]), done, metrics)
