"""Environments from other libraries, each a registered `Environment` named in an argument file like any other
(`environment` + `environment_args`); the library is imported when such an environment is built, so the core
needs none of them (they come with `pip install -r requirements.txt`, extra 'envs', except TRL's classes,
which need only the class).

    gymnasium   gym.py            {"env": "module:Class", ...}        reset(seed) / step(action) 5-tuples
    gem         gym.py            {"id": "game:GuessTheNumber-v0-easy"}  GEM (gem-llm)
    skyrl-gym   skyrl.py          {"id": "gsm8k_multi_turn"}          SkyRL-Gym init / step dicts
    textarena   arena.py          {"id": "TicTacToe-v0", "opponent": "random-move"}
    verifiers   verifiers_env.py  {"id": "my-env", "args": {...}}     0.3: load_environment; the rubric's reward
                verifiers_v1.py   {"id": "my-taskset", "args": {...}} 0.4 (own environment): a taskset's Rollout
    openenv     openenv_env.py    {"env": "module:Class"} or {"base_url": "http://..."}   async
    trl         trl_env.py        {"cls": "module:Class"}             reset(**row); public methods as tools

`routed` (alignment/envs/routed.py) picks one of several per row by its `environment` column.
"""
from alignment.envs.adapters.arena import TextArenaEnvironment
from alignment.envs.adapters.gym import GemEnvironment, GymnasiumEnvironment
from alignment.envs.adapters.openenv_env import OpenEnvEnvironment
from alignment.envs.adapters.skyrl import SkyRLEnvironment
from alignment.envs.adapters.trl_env import TRLEnvironment
from alignment.envs.adapters.verifiers_env import VerifiersEnvironment

__all__ = ["GemEnvironment", "GymnasiumEnvironment", "OpenEnvEnvironment", "SkyRLEnvironment", "TRLEnvironment",
           "TextArenaEnvironment", "VerifiersEnvironment"]
