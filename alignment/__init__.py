"""PaddlePaddle-native RLHF toolkit: SFT, reward modelling and PPO-family policy optimisation."""
from alignment.cpu_env import set_cpu_thread_defaults

set_cpu_thread_defaults()

__version__ = "0.1.0"
