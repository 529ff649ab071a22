"""Gymnasium-style text environments: `reset(seed) -> (obs, info)`, `step(action) -> (obs, reward, terminated,
truncated, info)`, with text observations and actions.

"gymnasium": any such class or factory, `environment_args: {"env": "module:Class", ...its keyword arguments}`.
"gem": a GEM (`gem-llm`) environment by id, `environment_args: {"id": "game:GuessTheNumber-v0-easy", "wrappers":
"python_tool", ...gem.make's keyword arguments}`.

Each episode is reset with the row's seed (`seed` column, else a hash of the row: the answers of one GRPO group
play one game); the observation of every step is the next user message, the step's reward the turn's reward, and
`terminated or truncated` ends the episode; the info dict's numbers are the step's metrics.
"""
from __future__ import annotations

from typing import Any, Callable, List, Mapping

from alignment.data import import_function
from alignment.envs.adapters.common import PrivateRandom, numbers, require, row_seed, user_message
from alignment.envs.base import Environment, Message, StepResult


class GymnasiumEnvironment(Environment):
    """A gymnasium-style text environment built by `env` ('module:Class' / 'file.py:Class' or a callable) with
    the remaining keyword arguments. The library's global random state is kept per episode (PrivateRandom)."""

    NAME = "gymnasium"

    def __init__(self, env: Any = None, **kwargs: Any):
        if env is None:
            raise ValueError("environment 'gymnasium': environment_args needs 'env' ('module:Class' or "
                             "'file.py:Class' of a gymnasium-style environment)")
        self.label = env if isinstance(env, str) else getattr(self, "label", getattr(env, "__name__", "env"))
        factory: Callable[..., Any] = import_function(env, "environment 'gymnasium' 'env'") \
            if isinstance(env, str) else env
        self.random = PrivateRandom()
        with self.random():
            self.env = factory(**kwargs)

    @property
    def env_name(self) -> str:
        return f"{self.NAME}[{self.label}]"

    def reset(self, row: Mapping[str, Any]) -> List[Message]:
        seed = row_seed(row)
        self.random = PrivateRandom(seed)
        with self.random():
            observation, _info = self.env.reset(seed=seed)
        return user_message(observation)

    def step(self, assistant_message: str) -> StepResult:
        with self.random():
            outcome = self.env.step(assistant_message)
        if not isinstance(outcome, tuple) or len(outcome) != 5:
            raise TypeError(f"step returned {type(outcome).__name__}; a gymnasium-style environment returns "
                            f"(observation, reward, terminated, truncated, info)")
        observation, reward, terminated, truncated, info = outcome
        done = bool(terminated) or bool(truncated)
        return StepResult(user_message(observation), float(reward), done, numbers(info))


class GemEnvironment(GymnasiumEnvironment):
    """A GEM environment (`gem.make(id, **kwargs)`), optionally wrapped by GEM's tool wrappers (`wrappers`, e.g.
    "python_tool": the environment runs the code blocks of an action). GEM's observation wrappers ("concat...")
    are refused: the conversation already carries the history they would repeat."""

    NAME = "gem"

    def __init__(self, id: str = "", wrappers: str = "", **kwargs: Any):
        if not id:
            raise ValueError("environment 'gem': environment_args needs 'id', e.g. 'game:GuessTheNumber-v0-easy'")
        if "concat" in wrappers:
            raise ValueError(f"environment 'gem': wrappers {wrappers!r}: observation wrappers repeat the history "
                             f"the conversation already holds; use tool wrappers only (e.g. 'python_tool')")
        self.label = id
        super().__init__(lambda: self._make(id, wrappers, kwargs))

    @staticmethod
    def _make(env_id: str, wrappers: str, kwargs: Mapping[str, Any]) -> Any:
        gem = require("gem", "gem-llm", "gem")
        env = gem.make(env_id, **kwargs)
        if wrappers:
            from gem.wrappers.wrapper_factory import get_wrapper_fns

            for wrap in get_wrapper_fns(wrappers):
                env = wrap(env)
        return env
