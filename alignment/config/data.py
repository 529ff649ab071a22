"""Arguments naming the model and the data (SFT, reward model, DPO; PPO extends the data arguments), and LoRA's."""
from __future__ import annotations

import dataclasses
from typing import Any, Dict, List, NamedTuple, Optional

from alignment.config.lora_adapters import check_lora_adapters
from alignment.config.parser import field
from alignment.config.training import DatasetSpecs, pipelined


@dataclasses.dataclass
class ModelArguments:
    """The model to start from."""

    model_name_or_path: str = field(help="HF-layout checkpoint directory to start from (config.json + safetensors "
                                         "+ tokenizer.json), e.g. checkpoints/tiny after `python tools/make_tiny.py`.")
    tokenizer_name_or_path: Optional[str] = field(None, help="Tokenizer directory; null = model_name_or_path.")

    @property
    def tokenizer_path(self) -> str:
        return self.tokenizer_name_or_path or self.model_name_or_path


@dataclasses.dataclass
class DataArguments:
    """Which data, how long."""

    train_datasets: DatasetSpecs = field(help="Training data: 'name', 'name:proportion', 'name:proportion:path', "
                                              "a list of those, or {name: proportion}. Names are registered "
                                              "RawDataset NAMEs (built-ins or user_dataset_modules). For PPO, "
                                              "prompt rows; an 'answer' column reaches reward functions.")
    eval_datasets: Optional[DatasetSpecs] = field(None, help="Evaluation data, same forms as train_datasets (PPO: "
                                                             "held-out prompts answered greedily every eval_steps "
                                                             "and at the start and end).")
    max_length: int = field(512, ge=8, help="Longest tokenized sample; longer ones are truncated, prompts that "
                                            "fill it are dropped (counts are printed). PPO: longest prompt + "
                                            "response; a prompt that leaves no room for a response is an error "
                                            "naming it.")
    user_dataset_modules: List[str] = field([], help="Python files or modules defining RawDataset subclasses to "
                                                     "register before the datasets are loaded; a relative file "
                                                     "path is looked up beside the argument file, then in the "
                                                     "working directory.")
    prompt_key: Optional[str] = field(None, help="PaddleNLP's src/tgt data: the column holding the prompt (null = "
                                                 "'src'); read by the paddlenlp-sft format, as PaddleNLP's RL "
                                                 "reader does.")
    response_key: Optional[str] = field(None, help="PaddleNLP's src/tgt data: the column holding the answer or "
                                                   "label (null = 'tgt').")
    chat_template: Optional[str] = field(None, help="null: the tokenizer's own chat template; 'none': no template, "
                                                    "prompts are already templated text and answers follow them "
                                                    "directly (PaddleNLP's chat_template: none).")

    def dataset_options(self) -> dict:
        """The options datasets may take (RawDataset.OPTIONS): which columns PaddleNLP's src/tgt rows use."""
        return {"prompt_key": self.prompt_key, "response_key": self.response_key}

    def validate(self) -> None:
        if self.chat_template is not None and self.chat_template.strip().lower() != "none":
            raise ValueError(f"key 'chat_template': only 'none' (prompts already templated) or null (the tokenizer's "
                             f"template) are read here, got {self.chat_template!r}; put a template in the "
                             "tokenizer's tokenizer_config.json")


class LoRAScaling(NamedTuple):
    alpha: float
    rslora: bool
    plus_scale: float


def lora_scaling(rank: int, alpha: float, rslora: bool, plus_scale: float, rslora_plus: bool) -> LoRAScaling:
    """PaddleNLP's run_finetune.py / run_dpo.py: rslora_plus sets rslora, lora_plus_scale 4 and lora_alpha 4; then
    lora_alpha -1 becomes 4 with rslora, else 2 x lora_rank."""
    if rslora_plus:
        rslora, plus_scale, alpha = True, 4.0, 4.0
    if alpha == -1:
        alpha = 4.0 if rslora else 2.0 * rank
    return LoRAScaling(float(alpha), bool(rslora), float(plus_scale))


@dataclasses.dataclass
class LoRAArguments:
    """Low-rank adapters instead of full fine-tuning."""

    lora: bool = field(False, help="Train LoRA adapters instead of all weights: base weights stay frozen, only "
                                   "the adapters (and a score model's head) are trained and saved, in PEFT's "
                                   "layout (merge with tools/merge_lora.py). In PPO this is the actor (critic_lora: "
                                   "the critic).")
    lora_rank: int = field(8, ge=1, help="LoRA rank r.")
    lora_alpha: float = field(16.0, help="LoRA alpha; the adapter output is scaled by lora_alpha / lora_rank "
                                         "(lora_alpha / sqrt(lora_rank) with rslora). -1: PaddleNLP's default, "
                                         "2 x lora_rank (4 with rslora).")
    rslora: bool = field(False, help="Rank-stabilised LoRA: scale by lora_alpha / sqrt(lora_rank) (recorded as "
                                     "PEFT's use_rslora in adapter_config.json).")
    lora_plus_scale: float = field(1.0, gt=0, help="LoRA+: the learning rate (and decoupled weight decay) of the "
                                                   "B matrices is lora_plus_scale x the base learning rate.")
    rslora_plus: bool = field(False, help="PaddleNLP's rsLoRA+: rslora true, lora_plus_scale 4 and lora_alpha 4 "
                                          "(they replace the values of those keys, as PaddleNLP does).")
    lora_dropout: float = field(0.0, ge=0, lt=1, help="Dropout on the adapter input.")
    lora_target_modules: List[str] = field(["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj",
                                            "down_proj"],
                                           help="Linear layers to adapt: names matched against the end of the "
                                                "module path, or regular expressions over the whole path.")
    lora_path: Optional[str] = field(None, help="Start from these saved adapters (a directory with "
                                                "adapter_config.json) instead of fresh ones; needs lora true.")
    lora_adapters: List[Dict[str, Any]] = field([], help="SFT and RL: several adapters trained in one run on one "
                                                         "frozen base, their steps interleaved: a list of {name, "
                                                         "and optionally train_datasets, eval_datasets, "
                                                         "learning_rate, seed, max_steps, lora_rank, lora_alpha, "
                                                         "lora_target_modules, and in RL reward_funcs, "
                                                         "reward_weights}, each replacing the run's key for that "
                                                         "adapter, which saves under output_dir/<name>/.")

    def validate(self) -> None:
        if not (self.lora_alpha > 0 or self.lora_alpha == -1):
            raise ValueError(f"key 'lora_alpha': must be > 0, or -1 for PaddleNLP's default, got {self.lora_alpha}")
        if not self.lora_target_modules:
            raise ValueError("key 'lora_target_modules' is empty")
        if self.lora_path and not self.lora:
            raise ValueError("key 'lora_path' needs 'lora': true")
        check_lora_adapters(self.lora_adapters, self.lora, self.lora_path)

    def scaling(self) -> "LoRAScaling":
        """The alpha, rsLoRA switch and LoRA+ scale that run, after rslora_plus and lora_alpha -1."""
        return lora_scaling(self.lora_rank, self.lora_alpha, self.rslora, self.lora_plus_scale, self.rslora_plus)

    def validate_with(self, *others) -> None:
        if self.lora and pipelined(others):
            raise ValueError("key 'lora': LoRA with pipeline_parallel_degree > 1 is not supported")
