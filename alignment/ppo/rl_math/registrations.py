"""The built-in advantage estimators, policy losses, KL estimators and distillation losses, registered by importing
their modules. The PPO arguments name them, so a stage imports this before it parses (alignment/config/registry.py)."""
from alignment.ppo.rl_math import distill, estimators, kl, losses  # noqa: F401
