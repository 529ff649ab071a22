"""PaddlePaddle-native RLHF toolkit: SFT, reward modelling and PPO-family policy optimisation.

Importing it changes no process settings; entry points call `alignment.cpu_env.apply_cpu_defaults()`."""

__version__ = "0.1.0"
