"""Every argument dataclass of every stage (plain data with validation), the argument-file parser and the
process layout the arguments ask for. The bottom layer: it imports nothing else of the package."""
from alignment.config.data import DataArguments, LoRAArguments, ModelArguments
from alignment.config.dpo import DPOArguments
from alignment.config.layout import Layout, plan
from alignment.config.parser import ArgumentError, ArgumentParser, field, to_dict
from alignment.config.ppo import PPOArguments, PPODataArguments, PPOModelArguments
from alignment.config.reward import RewardArguments
from alignment.config.training import TrainingArguments

__all__ = ["ArgumentError", "ArgumentParser", "DPOArguments", "DataArguments", "Layout", "LoRAArguments",
           "ModelArguments", "PPOArguments", "PPODataArguments", "PPOModelArguments", "RewardArguments",
           "TrainingArguments", "field", "plan", "to_dict"]
