"""Arguments naming the model and the data, shared by the SFT, reward and DPO stages."""
from __future__ import annotations

import dataclasses
from typing import List, Optional

from alignment.args import field
from alignment.training.arguments import DatasetSpecs


@dataclasses.dataclass
class ModelArguments:
    model_name_or_path: str = field(help="HF-layout checkpoint directory to start from (config.json + safetensors "
                                         "+ tokenizer.json), e.g. checkpoints/tiny after `python tools/make_tiny.py`.")
    tokenizer_name_or_path: Optional[str] = field(None, help="Tokenizer directory; null = model_name_or_path.")


@dataclasses.dataclass
class DataArguments:
    train_datasets: DatasetSpecs = field(help="Training data: 'name', 'name:proportion', 'name:proportion:path', "
                                              "a list of those, or {name: proportion}. Names are registered "
                                              "RawDataset NAMEs (built-ins or user_dataset_modules).")
    eval_datasets: Optional[DatasetSpecs] = field(None, help="Evaluation data, same forms as train_datasets.")
    max_length: int = field(512, help="Longest tokenized sample; longer ones are truncated, prompts that fill it "
                                      "are dropped (counts are printed).")
    user_dataset_modules: List[str] = field([], help="Python files or modules defining RawDataset subclasses to "
                                                     "register before the datasets are loaded.")

    def validate(self) -> None:
        if self.max_length < 8:
            raise ValueError(f"key 'max_length' must be >= 8, got {self.max_length}")
