"""Every argument dataclass of every stage (plain data with validation) and the argument-file parser. The bottom
layer: it imports nothing else of the package but the launcher's environment (alignment/launcher.py)."""
from alignment.config.data import DataArguments, LoRAArguments, ModelArguments
from alignment.config.dpo import DPOArguments
from alignment.config.parser import ArgumentError, ArgumentParser, field, to_dict
from alignment.config.ppo import PPOArguments, PPODataArguments, PPOModelArguments
from alignment.config.reward import RewardArguments
from alignment.config.training import TrainingArguments

__all__ = ["ArgumentError", "ArgumentParser", "DPOArguments", "DataArguments", "LoRAArguments",
           "ModelArguments", "PPOArguments", "PPODataArguments", "PPOModelArguments", "RewardArguments",
           "TrainingArguments", "field", "to_dict"]
