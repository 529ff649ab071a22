"""Training arguments shared by every stage, under PaddleNLP TrainingArguments' key names."""
from __future__ import annotations

import dataclasses
from typing import List, Optional, Union

from alignment.config.choices import LR_SCHEDULERS
from alignment.config.parser import field

DatasetSpecs = Union[str, List[str], dict]
WANDB_MODES = ("offline", "online", "disabled")


def pipelined(instances) -> bool:
    """Whether the parsed argument classes ask for pipeline stages (TrainingArguments.pipeline_parallel_degree)."""
    return any(getattr(instance, "pipeline_parallel_degree", 1) > 1 for instance in instances)


@dataclasses.dataclass
class TrainingArguments:
    """Schedule, optimizer, logging, checkpoints, precision, processes."""
    HELP_SECTIONS = {  # --help headings: the key that opens each section
        "output_dir": "Output and schedule",
        "learning_rate": "Optimizer",
        "logging_steps": "Logging, evaluation and checkpoints",
        "recompute": "Memory, progress and reporting",
        "bf16": "Mixed precision",
        "overwrite_output_dir": "Runs and resumption",
        "tensor_parallel_degree": "Processes (tensor / pipeline / sharding parallelism)",
    }

    output_dir: str = field("outputs/run", help="Directory for args.json, metrics.jsonl, tracker logs and checkpoints.")
    seed: int = field(42, ge=0, lt=2**32,
                      help="Seed for Python, numpy and Paddle RNGs (data order, dropout, sampling).")
    max_steps: int = field(-1, help="Total optimizer steps; -1 = derive from num_train_epochs.")
    num_train_epochs: float = field(1.0, ge=0, help="Passes over the training data when max_steps is -1.")
    per_device_train_batch_size: int = field(8, ge=1, help="Samples per forward/backward pass on each device.")
    per_device_eval_batch_size: int = field(8, ge=1, help="Samples per evaluation forward pass on each device.")
    gradient_accumulation_steps: int = field(1, ge=1, help="Micro-batches accumulated into one optimizer step.")
    learning_rate: float = field(2e-5, gt=0, help="Peak learning rate of AdamW.")
    min_learning_rate: float = field(0.0, ge=0, help="Learning rate at the end of the linear/cosine decay.")
    weight_decay: float = field(0.0, ge=0, help="AdamW decoupled weight decay (not applied to norms and biases).")
    adam_beta1: float = field(0.9, ge=0, lt=1, help="AdamW beta1.")
    adam_beta2: float = field(0.95, ge=0, lt=1, help="AdamW beta2.")
    adam_epsilon: float = field(1e-8, gt=0, help="AdamW epsilon.")
    max_grad_norm: float = field(1.0, ge=0, help="Clip the global gradient norm to this value; 0 = no clipping.")
    lr_scheduler_type: str = field("cosine", help=f"Learning-rate schedule after warmup: one of {LR_SCHEDULERS}.")
    warmup_ratio: float = field(0.0, ge=0, lt=1, help="Fraction of the total steps spent in linear warmup.")
    warmup_steps: int = field(0, ge=0, help="Warmup steps; overrides warmup_ratio when > 0.")
    logging_steps: int = field(10, ge=1, help="Log loss, learning rate and throughput every N optimizer steps.")
    do_eval: bool = field(True, help="Evaluate on eval_datasets (when given) every eval_steps and at the end.")
    eval_steps: int = field(0, ge=0, help="Evaluate every N optimizer steps; 0 = only at the end of training.")
    save_steps: int = field(0, ge=0, help="Save a checkpoint under output_dir/checkpoint-N every N steps; 0 = only the final one.")
    load_best_model_at_end: bool = field(False, help="Keep the model of the best evaluation during training as the "
                                                     "final model (saved to output_dir/best when it is reached; "
                                                     "alignment/training/best_model.py).")
    metric_for_best_model: Optional[str] = field(None, help="The evaluation metric that picks the best model: "
                                                            "'loss', 'accuracy', 'reward', 'gold_reward', ... ("
                                                            "'eval_' / 'eval/' prefixes allowed); null = "
                                                            "'loss'.")
    greater_is_better: Optional[bool] = field(None, help="Whether a larger metric_for_best_model is better; null = "
                                                         "true unless the metric ends in 'loss'.")
    save_total_limit: int = field(0, ge=0, help="Keep only the newest N step checkpoints; 0 = keep all.")
    recompute: bool = field(False, help="Activation checkpointing: recompute each decoder layer in backward (saves memory).")
    dataloader_drop_last: bool = field(False, help="Drop the last, shorter batch of each pass over the training "
                                                   "data (PPO: over the prompts) instead of training on it.")
    disable_tqdm: bool = field(False, help="Hide the progress bar (logs are still printed and written).")
    report_to: List[str] = field(["visualdl"], help="Where metrics go besides metrics.jsonl and the console, a "
                                                    "list of trackers (docs/trackers.md): visualdl, tensorboard, "
                                                    "wandb, swanlab, mlflow, trackio; 'all' = every one whose "
                                                    "package is installed, 'none' or [] = none. A comma string and "
                                                    "PaddleNLP's / HF's spellings are read too.")
    run_name: Optional[str] = field(None, help="The run's name in the trackers; null = output_dir's last folder.")
    logging_dir: Optional[str] = field(None, help="Where the trackers' local files go (visualdl/, tensorboard/, "
                                                  "wandb/, swanlog/, mlflow.db; trackio keeps its own store, "
                                                  "TRACKIO_DIR); a relative path is taken under output_dir "
                                                  "(PaddleNLP: under the working directory); null = output_dir.")
    project: Optional[str] = field(None, help="The project (MLflow: experiment) the run is filed under in wandb, "
                                              "swanlab, mlflow and trackio; null = the tracker's own environment "
                                              "variable (WANDB_PROJECT, MLFLOW_EXPERIMENT_NAME) or 'alignment'; "
                                              "a config's wandb_project sets it too.")
    wandb_mode: Optional[str] = field(None, help="wandb's mode: 'offline' (files under logging_dir/wandb; "
                                                 "`wandb sync` uploads them), 'online' or 'disabled'; null = "
                                                 "WANDB_MODE, else 'offline'.")
    bf16: bool = field(False, help="Mixed precision in bfloat16 (paddle.amp; on Paddle's CPU build: float32 with a "
                                   "notice).")
    fp16: bool = field(False, help="Mixed precision in float16 with a dynamic loss scale (paddle.amp.GradScaler).")
    fp16_opt_level: str = field("O1", help="AMP level for bf16/fp16: O1 (matmuls in the low dtype) or O2 (weights "
                                           "in the low dtype, float32 master weights in the optimizer).")
    amp_master_grad: bool = field(False, help="O2: keep float32 gradients too (paddle.amp.decorate master_grad).")
    amp_custom_white_list: List[str] = field([], help="Extra ops to run in the low dtype under bf16/fp16.")
    amp_custom_black_list: List[str] = field([], help="Ops to keep in float32 under bf16/fp16.")
    scale_loss: float = field(32768.0, gt=0, help="fp16: the initial loss scale of the dynamic GradScaler.")
    overwrite_output_dir: bool = field(False, help="Start a fresh run in an output_dir that holds another run's "
                                                   "checkpoints, metrics or arguments: they are removed first. "
                                                   "Without it (and without resume_from_checkpoint) such a "
                                                   "directory is refused, so no run is lost by mistake.")
    resume_from_checkpoint: Optional[str] = field(None, help="Resume exactly from a checkpoint-N directory "
                                                             "(written every save_steps), or \"auto\": the newest "
                                                             "complete one in output_dir (a fresh start when there "
                                                             "is none).")
    tensor_parallel_degree: int = field(1, ge=1, help="Split every model's layers over this many processes "
                                                      "(Megatron-style tensor parallelism on fleet's parallel "
                                                      "layers); 1 = off.")
    pipeline_parallel_degree: int = field(1, ge=1, help="Split the trained models (PPO's policy and critic, the SFT "
                                                        "/ DPO policy, the reward model) into this many pipeline "
                                                        "stages (1F1B over gradient_accumulation_steps micro-batches "
                                                        "of per_device_train_batch_size).")
    expert_parallel_degree: int = field(1, ge=1, help="Mixture-of-experts models: split each sparse layer's experts "
                                                      "over this many data-parallel processes, which send each "
                                                      "token to the ranks holding its chosen experts and combine "
                                                      "the results (docs/parallel/expert.md); divides the number "
                                                      "of processes and each model's expert count; 1 = off.")
    sharding: str = field("", help="ZeRO sharding over the sharding processes (docs/parallel/sharding.md): 'stage1' "
                                   "splits the AdamW states (fleet's sharding optimizer), 'stage2' also the "
                                   "gradients, 'stage3' also the parameters (Paddle's group_sharded_parallel 'os_g' "
                                   "/ 'p_g_os'); '' = off.")
    lost_rank_timeout: float = field(120.0, ge=0, help="Multi-process runs: seconds without a heartbeat from another "
                                                       "rank (a killed process, a lost host) after which every other "
                                                       "rank exits with code 1 and a message naming it, instead of "
                                                       "waiting in a collective; 0 = off (Paddle's own timeouts only).")
    sharding_parallel_degree: int = field(-1, help="Processes in one sharding group; -1 = all processes left after "
                                                   "tensor and pipeline parallelism. Data parallelism fills the rest.")
    sharding_segment_size: int = field(2**20, ge=0, help="sharding stage3: parameters with more elements than this "
                                                        "are split over the sharding processes, smaller ones stay "
                                                        "whole on each (Paddle's segment_size; 2**20 as there).")
    benchmark: bool = field(False, help="PaddleNLP's throughput mode: train the steps without evaluating or saving "
                                        "anything (no checkpoints, no final model), log every step (unless "
                                        "disable_tqdm) and end with tokens/s, step time and each rank's peak "
                                        "memory (alignment/training/benchmark.py).")
    max_nonfinite_steps: int = field(5, ge=1, help="A step whose loss or gradients are NaN/inf is skipped and counted "
                                                   "(skipped_steps); after this many in a row the run stops.")

    def validate(self) -> None:
        if self.max_steps == 0 or self.max_steps < -1:
            raise ValueError(f"key 'max_steps' must be -1 (use num_train_epochs) or >= 1, got {self.max_steps}")
        if self.max_steps == -1 and self.num_train_epochs <= 0:
            raise ValueError("key 'num_train_epochs' must be > 0 when max_steps is -1")
        if self.min_learning_rate > self.learning_rate:
            raise ValueError("key 'min_learning_rate' must be between 0 and learning_rate")
        if self.lr_scheduler_type not in LR_SCHEDULERS:
            raise ValueError(f"key 'lr_scheduler_type' must be one of {LR_SCHEDULERS}, got {self.lr_scheduler_type!r}")
        if self.load_best_model_at_end and not (self.do_eval and self.eval_steps > 0):
            raise ValueError("key 'load_best_model_at_end' needs evaluations during training: do_eval true and "
                             "eval_steps > 0 (evaluation_strategy steps)")
        if self.bf16 and self.fp16:
            raise ValueError("keys 'bf16' and 'fp16' are both true; choose one")
        if any(not name or name != name.strip() for name in self.report_to):
            raise ValueError(f"key 'report_to' holds an empty or padded name: {self.report_to!r}")
        if len(self.report_to) > 1 and {"none", "all"} & set(self.report_to):
            raise ValueError(f"key 'report_to': 'none' and 'all' stand alone, got {self.report_to!r}")
        if self.wandb_mode is not None and self.wandb_mode not in WANDB_MODES:
            raise ValueError(f"key 'wandb_mode' must be one of {WANDB_MODES} or null, got {self.wandb_mode!r}")
        if self.fp16_opt_level not in ("O1", "O2"):
            raise ValueError(f"key 'fp16_opt_level' must be O1 or O2, got {self.fp16_opt_level!r}")
