"""Stage 3, policy optimisation: PPO with a critic, or critic-free GRPO / REINFORCE++ / RLOO (a teacher's
distillation term optional: teacher_model_name_or_path; alignment/ppo/stage.py runs it).

    python alignment/ppo/run_ppo.py config/tiny/ppo_argument.json [--key value ...]
"""
from __future__ import annotations

import os
import sys

if not __package__:  # run as a script from a checkout: make `alignment` importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from alignment import entry  # noqa: E402  first: this CPU's settings before paddle is imported (alignment/entry.py)

import alignment.ppo.rl_math.registrations  # noqa: E402,F401  registers what the arguments name, before they are parsed
from alignment.config.asynchronous import AsyncArguments  # noqa: E402,F401  (tests import them from here)
from alignment.config.data import LoRAArguments  # noqa: E402,F401
from alignment.config.environment import EnvironmentArguments  # noqa: E402,F401
from alignment.config.ppo import PPOArguments  # noqa: E402
from alignment.ppo.stage import build_models, serve_rollouts, stream_steps, train  # noqa: E402,F401


def main(argv=None) -> dict:
    return train(argv, PPOArguments)


if __name__ == "__main__":
    entry.run(main)
