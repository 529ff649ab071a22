"""On-policy distillation and GKD: the student samples, a teacher scores each of its tokens, and the policy learns the
teacher's distributions (alignment/ppo/teacher/teacher.py, alignment/ppo/rl_math/distill.py); no reward needed. The PPO
stage's program with its defaults for distillation (advantage_estimator 'none', kl_coeff 0) and a teacher required;
rewards, when given, add their advantages (set advantage_estimator).

    python alignment/ppo/run_distill.py config/tiny/distill_argument.json [--key value ...]
"""
from __future__ import annotations

import os
import sys

if not __package__:  # run as a script from a checkout: make `alignment` importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from alignment import entry  # noqa: E402  first: this CPU's settings before paddle is imported (alignment/entry.py)

import alignment.ppo.rl_math.registrations  # noqa: E402,F401  registers what the arguments name, before they are parsed
from alignment.config.distill import DistillPPOArguments  # noqa: E402
from alignment.ppo.stage import train  # noqa: E402


def main(argv=None) -> dict:
    return train(argv, DistillPPOArguments)


if __name__ == "__main__":
    entry.run(main)
