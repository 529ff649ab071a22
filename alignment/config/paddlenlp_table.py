"""The table of PaddleNLP's argument keys that are not ours: for each, a `Rule` saying whether it is an alias of our
key, a notice (accepted; why it changes nothing here), or a refusal (the alternative). `alignment.config.paddlenlp`
applies it; the module docstring there explains the three kinds. Plain Python (bottom layer)."""
from __future__ import annotations

from typing import Any, Callable, Dict, NamedTuple, Optional, Union

from alignment.config.paddlenlp_values import (as_flag, as_number, asks_nothing, data_world_size, get_degree,
                                               get_int, get_set, one_of, same_value)

ALIAS, NOTICE, REFUSE = "alias", "notice", "refuse"

Note = Union[str, Callable[[Any, dict], Optional[str]]]  # a fixed text, or f(value, all values) -> text / None


class Rule(NamedTuple):
    kind: str                   # ALIAS, NOTICE or REFUSE
    target: Optional[str]       # our key (ALIAS); for NOTICE / REFUSE: our key that honours it once it exists
    note: Note = ""             # why it changes nothing (NOTICE), the alternative (REFUSE), README text (ALIAS)
    inert: Optional[Callable[[Any, dict], bool]] = None  # values accepted silently; default: asks_nothing


# --- notes ----------------------------------------------------------------------------------------------------------

def _fused(what: str) -> str:
    return f"this toolkit has no fused kernel for {what}; plain Paddle ops run instead (same math)"


# PaddleNLP's switches for fused kernels, each with what it fuses (key, then the words after the spaces)
FUSED_KERNELS = dict(line.split(maxsplit=1) for line in """
use_flash_attention              attention (flash attention)
flash_mask                       masked attention (FlashMask)
use_attn_mask_start_row_indices  masked attention (FlashMask row indices)
use_fused_rms_norm               RMSNorm
use_fused_rope                   rotary position embeddings
use_fused_linear                 linear layers
fused_linear                     linear layers (fused_gemm_epilogue)
use_fused_linear_cross_entropy   linear + cross-entropy
use_fused_dropout_add            dropout + residual add
fuse_attention_qkv               the q/k/v projections
fuse_attention_ffn               the gate/up projections
use_fused_head_and_loss_fn       the LM head + loss
use_quick_lora                   LoRA (quick LoRA)
""".strip().splitlines())

MEMORY_ONLY = "a speed / memory switch of PaddleNLP's implementation; it does not change what is computed here"
COMM = "a communication-tuning option of PaddleNLP's fleet set-up; it does not change what is computed here"
NO_WANDB_KEY = ("wandb reads the key from the environment here (WANDB_API_KEY, or `wandb login`), so that it stays "
                "out of args.json and the trackers' copies of the arguments")
RL_ALGORITHMS = {"ppo": "gae", "grpo": "grpo", "reinforce_plus_plus": "reinforce_plus_plus", "vapo": "vapo"}  # ours
CHUNKS = ("the rows per inference pass of PaddleNLP's rollout engine; this toolkit chooses its own chunks (same "
          "values, different memory)")
COLUMNS = ("the columns a dataset reads are fixed by its format here (PaddleNLP's src/tgt rows: prompt_key / "
           "response_key); this key picks no column")


def _recompute_note(flag_key: str) -> Note:
    def note(value, values):
        if not as_flag(get_set(values, flag_key, False)) or same_value(value, "full"):
            return None  # recompute off, or whole layers: what this toolkit does
        return (f"this toolkit recomputes whole decoder layers ('full') when {flag_key} is true, not {value!r}; "
                "gradients are the same, only memory differs")
    return note


def _sequence_parallel(value, values):
    if get_degree(values, "tensor_parallel_degree") <= 1:
        return "no effect with tensor_parallel_degree 1 (PaddleNLP turns it off too)"
    return ("activations are not split along the sequence here; tensor parallelism gives the same results with more "
            "activation memory")


def _prompt_cap(value, values):
    longest = get_int(values, "max_length", get_int(values, "max_seq_len", 0))
    if as_number(value) is not None and as_number(value) >= longest > 0:
        return None  # no prompt can be longer than max_length anyway
    return (f"prompts are not cut to {value} tokens here; max_length bounds prompt + response (PPO: a prompt that "
            "leaves no room for a response is an error naming it; RM / DPO: pairs are truncated at max_length)")


def _needs_dynamic_sampling(value, values):
    return not as_flag(get_set(values, "dynamic_sampling", False))  # only read by dynamic sampling


def _gen_batch_inert(value, values):
    """Silent without dynamic sampling, for -1 / 0 (PaddleNLP: global_batch_size) and for global_batch_size."""
    return _needs_dynamic_sampling(value, values) or asks_nothing(value) or \
        same_value(value, (get_set(values, "global_batch_size", None),))


def _sample_batch_inert(value, values):
    """Silent without dynamic sampling, for -1 / 0 and for the per-device share of global_batch_size."""
    per_device = as_number(get_set(values, "global_batch_size", None))
    return _needs_dynamic_sampling(value, values) or asks_nothing(value) or (
        per_device is not None and as_number(value) == per_device / data_world_size(values))


def _decay_steps(value, values):
    return asks_nothing(value) or get_int(values, "max_steps", -1) == as_number(value)  # PaddleNLP's default: max_steps


def _ignore_load(value, values):
    return asks_nothing(value) or not get_set(values, "resume_from_checkpoint", None)


def _tp_output(value, values):
    return asks_nothing(value) or get_degree(values, "tensor_parallel_degree") <= 1


def _rollout_tp(value, values):
    return asks_nothing(value) or get_int(values, "rollout_tensor_parallel_degree", -1) == \
        get_degree(values, "tensor_parallel_degree")


# --- the table ------------------------------------------------------------------------------------------------------

TABLE: Dict[str, Rule] = {
    # ---- renamed keys (honoured) ----
    "rollout_n": Rule(ALIAS, "num_return_sequences", "responses sampled per prompt"),
    "max_dec_len": Rule(ALIAS, "max_new_tokens", "longest response"),
    "critic_model_name_or_path": Rule(ALIAS, "reward_critic_model_name_or_path", "critic initialisation"),
    "max_seq_len": Rule(ALIAS, "max_length", "longest tokenized sample (DPO / RM flashmask files)"),
    "train_dataset_path": Rule(ALIAS, "train_datasets", "training data: a file, directory or comma-separated list "
                                                        "of them, each read in the format its keys show (PaddleNLP's "
                                                        "src/tgt, src/tgt/response/sort, ...), or our dataset specs"),
    "dev_dataset_path": Rule(ALIAS, "eval_datasets", "evaluation data, as for train_dataset_path"),
    "sharding_degree": Rule(ALIAS, "sharding_parallel_degree", "PaddleNLP's deprecated spelling",
                            inert=lambda value, values: as_number(value) is not None and as_number(value) <= 0),
    "sft_loss_ratio": Rule(ALIAS, "nll_loss_coef", "weight of the SFT (chosen-response NLL) term of DPO"),
    "rl_algorithm": Rule(ALIAS, "advantage_estimator", ", ".join(f"{k} -> {v}" for k, v in RL_ALGORITHMS.items()) +
                         " (grpo also sets kl_coeff, normalize_reward, normalize_advantage off, as PaddleNLP's does)"),
    "global_batch_size": Rule(ALIAS, "per_device_prompt_batch_size", "prompts per step over all processes: divided "
                                                                     "by the data-parallel processes"),
    "global_mini_batch_size": Rule(ALIAS, "gradient_accumulation_steps", "prompts per optimizer step: "
                                                                         "global_mini_batch_size x rollout_n x "
                                                                         "update_iters / per_device_train_batch_size "
                                                                         "/ data-parallel processes, as PaddleNLP "
                                                                         "computes it (-1: global_batch_size)"),
    "mini_batch_size": Rule(ALIAS, "gradient_accumulation_steps", "the earlier name of global_mini_batch_size "
                                                                  "(qwen grpo_argument.yaml before the rename, same "
                                                                  "comment 'Mini-batch size for training'): the "
                                                                  "same formula"),
    "evaluation_strategy": Rule(ALIAS, "eval_steps", "'no': eval_steps 0 (no evaluation during training; do_eval "
                                                     "still evaluates at the end); 'steps': eval_steps (or "
                                                     "logging_steps when unset); 'epoch': at the end of a one-epoch "
                                                     "run, else at the end with a notice"),
    "save_strategy": Rule(ALIAS, "save_steps", "'no': save_steps 0 (only the final model); 'steps': save_steps "
                                               "(PaddleNLP's 500 when unset); 'epoch': the final model, with a notice "
                                               "unless the run is one epoch"),
    "do_train": Rule(REFUSE, None, "the run_*.py entry points always train; to only evaluate or generate, use "
                                   "tools/predict.py, tools/generate.py or tools/judge_policy.py",
                     inert=lambda value, values: as_flag(value) is not False),

    # ---- kernels: nothing fused here (same math) ----
    **{key: Rule(NOTICE, None, _fused(what)) for key, what in FUSED_KERNELS.items()},
    "use_fusemt": Rule(NOTICE, None, "this toolkit has no fused-transformer rollout kernels; plain Paddle ops "
                                     "generate the rollouts (same sampling, slower)"),

    # ---- recompute ----
    "recompute_granularity": Rule(NOTICE, None, _recompute_note("recompute"), inert=lambda v, vs: False),
    "critic_recompute_granularity": Rule(NOTICE, None, _recompute_note("critic_recompute"),
                                         inert=lambda v, vs: False),
    "recompute_use_reentrant": Rule(NOTICE, None, "this toolkit recomputes with Paddle's non-reentrant recompute "
                                                  "(the reentrant path crashed); same gradients"),
    "refined_recompute": Rule(NOTICE, None, "this toolkit recomputes whole decoder layers; only memory differs"),
    "no_recompute_layers": Rule(NOTICE, None, "this toolkit recomputes every decoder layer when recompute is true; "
                                              "only memory differs"),
    "pp_recompute_interval": Rule(NOTICE, None, "this toolkit recomputes every decoder layer when recompute is "
                                                "true; only memory differs", inert=one_of(1)),

    # ---- parallelism and communication ----
    "sequence_parallel": Rule(NOTICE, None, _sequence_parallel),
    "tensor_parallel_output": Rule(NOTICE, None, "logits are gathered over tensor-parallel ranks before the loss "
                                                 "here; the loss is the same", inert=_tp_output),
    "virtual_pp_degree": Rule(NOTICE, None, "pipelines run plain 1F1B here (no interleaved virtual stages); same "
                                            "results", inert=one_of(1)),
    "sep_parallel_degree": Rule(REFUSE, None, "sequence (sep) parallelism is not built; use "
                                              "tensor_parallel_degree / pipeline_parallel_degree", inert=one_of(1)),
    "context_parallel_degree": Rule(REFUSE, None, "context parallelism is not built; use tensor_parallel_degree / "
                                                  "pipeline_parallel_degree", inert=one_of(1)),
    "rollout_tensor_parallel_degree": Rule(NOTICE, None, "rollouts run in the training layout here (eval_mode "
                                                         "'single': a whole copy of the actor); same samples",
                                           inert=_rollout_tp),
    "data_parallel_config": Rule(NOTICE, None, COMM),
    "sequence_parallel_config": Rule(NOTICE, None, COMM),
    "tensor_parallel_config": Rule(NOTICE, None, COMM),
    "pipeline_parallel_config": Rule(NOTICE, None, COMM),
    "sharding_parallel_config": Rule(NOTICE, None, COMM),
    "sharding_parallel_mesh_dimension": Rule(NOTICE, None, COMM, inert=one_of("dp")),
    "sharding_comm_buffer_size_MB": Rule(NOTICE, None, COMM),
    "fuse_sequence_parallel_allreduce": Rule(NOTICE, None, COMM),
    "hybrid_parallel_topo_order": Rule(NOTICE, None, COMM, inert=one_of("pp_first")),
    "enable_auto_parallel": Rule(NOTICE, None, "this toolkit runs fleet's hybrid (manual) parallelism; the "
                                               "degrees are honoured, the auto-parallel engine is not used"),
    "use_expert_parallel": Rule(NOTICE, None, "expert parallelism is on here when expert_parallel_degree > 1"),
    "expert_max_capacity": Rule(NOTICE, None, "no token capacity here: every routed token runs", inert=one_of(2 ** 32)),
    "expert_min_capacity": Rule(NOTICE, None, "no token capacity here: every routed token runs", inert=one_of(1)),
    "local_rank": Rule(NOTICE, None, "ranks come from paddle.distributed.launch here"),
    "ddp_find_unused_parameters": Rule(NOTICE, None, "gradients are averaged over data-parallel ranks after the "
                                                     "backward pass here; no DataParallel wrapper needs it"),
    "device": Rule(NOTICE, None, "this toolkit runs on the device Paddle was built for (paddle.get_device())"),
    "no_cuda": Rule(NOTICE, None, "this toolkit runs on the device Paddle was built for (paddle.get_device())"),
    "flatten_param_grads": Rule(NOTICE, None, "an NPU optimizer switch; it does not change what is computed"),
    "release_grads": Rule(NOTICE, None, MEMORY_ONLY),
    "offload_optim": Rule(NOTICE, None, "use offload_level 'optimizer' (PPO) to move optimizer states to host "
                                        "memory; results are the same either way"),
    "to_static": Rule(NOTICE, None, "training runs in dynamic graph here (same math)"),

    # ---- precision ----
    "bf16_full_eval": Rule(NOTICE, None, "evaluation runs in the training precision here"),
    "fp16_full_eval": Rule(NOTICE, None, "evaluation runs in the training precision here"),
    "use_fp32_compute": Rule(NOTICE, "use_fp32_compute", "this toolkit always computes log-probs, rewards, "
                                                         "advantages and losses in float32",
                             inert=lambda value, values: as_flag(value) is not False),

    # ---- optimizer and schedule ----
    "optim": Rule(REFUSE, None, "this toolkit trains with AdamW only", inert=one_of("adamw")),
    "num_cycles": Rule(REFUSE, None, "the cosine schedule here is a half wave (PaddleNLP's 0.5)", inert=one_of(0.5)),
    "lr_end": Rule(NOTICE, None, "used by the polynomial schedule only, which this toolkit does not have",
                   inert=lambda value, values: get_set(values, "lr_scheduler_type", "") != "polynomial"),
    "power": Rule(NOTICE, None, "used by the polynomial schedule only, which this toolkit does not have",
                  inert=lambda value, values: get_set(values, "lr_scheduler_type", "") != "polynomial"),
    "decay_steps": Rule(REFUSE, None, "the schedule decays over the whole run here (PaddleNLP's default: "
                                      "max_steps); remove decay_steps or set it to max_steps", inert=_decay_steps),
    "critic_decay_steps": Rule(REFUSE, None, "the critic's schedule decays over the whole run here; remove "
                                             "critic_decay_steps", inert=asks_nothing),

    # ---- evaluation, logging, reporting ----
    "eval_accumulation_steps": Rule(NOTICE, None, "evaluation results are reduced batch by batch here; only memory "
                                                  "differs"),
    "prediction_loss_only": Rule(NOTICE, None, "evaluation reports this toolkit's metrics (loss, accuracy, rewards)"),
    "max_evaluate_steps": Rule(NOTICE, None, "evaluation always covers all of eval_datasets here"),
    "minimum_eval_times": Rule(NOTICE, None, "evaluation runs every eval_steps and at the end here"),
    "early_stopping": Rule(REFUSE, None, "early stopping is not built; set max_steps / num_train_epochs"),
    "early_stopping_patience": Rule(NOTICE, None, "used with early_stopping only", inert=lambda value, values: True),
    "early_stopping_threshold": Rule(NOTICE, None, "used with early_stopping only", inert=lambda value, values: True),
    "logging_strategy": Rule(NOTICE, None, "a row is logged every logging_steps steps and at the last step here",
                             inert=one_of("steps")),
    "logging_first_step": Rule(NOTICE, None, "rows are logged every logging_steps steps (logging_steps 1 logs the "
                                             "first)"),
    "log_on_each_node": Rule(NOTICE, None, "logs are written by rank 0 only here"),
    "output_signal_dir": Rule(NOTICE, None, "checkpoints are written synchronously here; there are no save signals"),
    "wandb_api_key": Rule(NOTICE, None, NO_WANDB_KEY),
    "wandb_http_proxy": Rule(NOTICE, None, "wandb reads its proxy from the environment here (HTTPS_PROXY)"),
    "wandb_project": Rule(ALIAS, "project", "the trackers' project"),
    "metrics_output_path": Rule(NOTICE, None, "metrics go to output_dir/metrics.jsonl here"),
    "skip_memory_metrics": Rule(NOTICE, None, "this toolkit logs its own time/* and memory/* metrics",
                                inert=lambda value, values: True),
    "skip_profile_timer": Rule(NOTICE, None, "this toolkit always logs its time/* metrics",
                               inert=lambda value, values: True),
    "do_predict": Rule(NOTICE, None, "no prediction pass follows training; run tools/predict.py on the output"),
    "do_export": Rule(NOTICE, None, "no export follows training; run tools/export_model.py on the output"),
    "eval_with_do_generation": Rule(NOTICE, None, "reward-model evaluation reports pairwise accuracy and scores "
                                                  "here"),
    "save_generation_output": Rule(NOTICE, None, "reward-model evaluation generates nothing here"),

    # ---- checkpoints ----
    "save_on_each_node": Rule(NOTICE, None, "rank 0 (and each rank's own shard) writes checkpoints here"),
    "save_sharded_model": Rule(NOTICE, None, "checkpoints are written in this toolkit's layout (resharded on load)"),
    "load_sharded_model": Rule(NOTICE, None, "checkpoints are read in this toolkit's layout (resharded on load)"),
    "use_async_save": Rule(NOTICE, None, "checkpoints are written synchronously and atomically here"),
    "ordered_save_group_size": Rule(NOTICE, None, "checkpoints are written synchronously and atomically here"),
    "unified_checkpoint": Rule(NOTICE, None, "this toolkit writes its own checkpoint layout (final models as HF "
                                             "safetensors; step checkpoints reshard to any layout)"),
    "unified_checkpoint_config": Rule(NOTICE, None, "this toolkit writes its own checkpoint layout"),
    "ckpt_quant_stage": Rule(NOTICE, None, "checkpoints are stored unquantized here", inert=one_of("O0")),
    "ignore_save_lr_and_optim": Rule(NOTICE, None, "step checkpoints keep optimizer and schedule states so a resumed "
                                                   "run is exact (larger checkpoints); the final model is weights "
                                                   "only either way"),
    "ignore_load_lr_and_optim": Rule(REFUSE, None, "resuming restores optimizer and schedule here; to start fresh "
                                                   "from saved weights, point the model path at them instead of "
                                                   "resume_from_checkpoint", inert=_ignore_load),
    "force_reshard_pp": Rule(NOTICE, None, "step checkpoints are resharded to the run's layout when needed"),
    "auto_parallel_resume_form_hybrid_parallel": Rule(NOTICE, None, "this toolkit has no auto-parallel mode"),
    "save_sharding_stage1_model_include_freeze_params": Rule(NOTICE, None, "final models are saved whole here"),
    "pdc_download_ckpt": Rule(NOTICE, None, "checkpoints are read from output_dir / resume_from_checkpoint"),
    "pdc_download_timeout": Rule(NOTICE, None, "checkpoints are read from output_dir / resume_from_checkpoint",
                                 inert=one_of(300)),
    "ignore_data_skip": Rule(NOTICE, None, "a resumed run always continues the data stream where the checkpoint "
                                           "stopped (exact resume)"),

    # ---- data loading ----
    "dataloader_shuffle": Rule(NOTICE, None, "data is always drawn in a seeded shuffled order here (the file order "
                                             "is not kept)", inert=lambda value, values: as_flag(value) is not False),
    "dataloader_num_workers": Rule(NOTICE, None, "data is prepared in the main process here; same batches"),
    "distributed_dataloader": Rule(NOTICE, None, "every data-parallel rank reads its own share here; same batches"),
    "lazy_data_processing": Rule(NOTICE, None, MEMORY_ONLY, inert=lambda value, values: True),
    "lazy": Rule(NOTICE, None, "data is tokenized up front here; same samples"),
    "greedy_zero_padding": Rule(NOTICE, None, "micro-batches are padded here (no zero-padding packing); same loss"),
    "zero_padding": Rule(NOTICE, None, "micro-batches are padded here (no zero-padding packing); same loss",
                         inert=lambda value, values: as_flag(value) is False),
    "remove_unused_columns": Rule(NOTICE, None, "datasets keep the columns their type reads",
                                  inert=lambda value, values: True),
    "label_names": Rule(NOTICE, None, "labels come from the dataset type here"),
    "past_index": Rule(NOTICE, None, "not used by decoder-only LLaMA-family models"),
    "skip_data_intervals": Rule(REFUSE, None, "skipping step intervals is not built; filter the dataset instead"),
    **dict.fromkeys(("dataset_name_or_path", "task_name"),
                    Rule(NOTICE, None, "the reward model reads train_datasets / eval_datasets")),
    "eval_split_ratio": Rule(REFUSE, None, "held-out data is not split off the training data here; name it in "
                                           "eval_datasets"),
    "label_key": Rule(NOTICE, None, COLUMNS, inert=one_of("answer", "tgt")),
    **dict.fromkeys(("max_prompt_len", "max_src_len"), Rule(NOTICE, None, _prompt_cap)),
    "eos_token": Rule(REFUSE, None, "responses end at the tokenizer's own EOS token here; set eos_token in the "
                                    "tokenizer files instead"),
    **dict.fromkeys(("actor_tokenizer_alpha", "reward_tokenizer_alpha", "reward_critic_tokenizer_alpha",
                     "critic_tokenizer_alpha"), Rule(REFUSE, None, "tokenizer sampling (BPE dropout) is not built")),

    # ---- RL rollouts and batches ----
    "min_dec_len": Rule(ALIAS, "min_new_tokens", "shortest response: eos is blocked before it"),
    "per_device_rollout_batch_size": Rule(NOTICE, None, "a step's per-device prompts (per_device_prompt_batch_size, "
                                                        "from global_batch_size) are generated in one call here; "
                                                        "same samples"),
    **dict.fromkeys(("per_device_logprob_batch_size", "per_device_reward_batch_size", "per_device_value_batch_size",
                     "rollout_logprob_batch_size", "rollout_max_num_seqs"), Rule(NOTICE, None, CHUNKS)),
    **dict.fromkeys(("rollout_quant_type", "quant_type"), Rule(REFUSE, None, "quantized rollouts are not built: "
                                                                       "rollouts sample from the trained weights; "
                                                                       "remove the key")),
    "use_remove_padding": Rule(NOTICE, None, "forward passes keep their padding here (masked); same values"),
    "balance_batch": Rule(NOTICE, None, "rollouts are not rebalanced by token count across data-parallel ranks; "
                                        "with one data-parallel rank nothing differs"),
    # dynamic_sampling and max_gen_batches are ours (PPOArguments)
    "global_gen_batch_size": Rule(NOTICE, None, "dynamic sampling draws generation batches of global_batch_size "
                                                "prompts here (as many as it needs); the groups a step keeps are "
                                                "the same, only the number of tries differs",
                                  inert=_gen_batch_inert),
    "per_device_sample_batch_size": Rule(NOTICE, None, "dynamic sampling keeps per_device_prompt_batch_size "
                                                       "(from global_batch_size) prompt groups per step here",
                                         inert=_sample_batch_inert),
    "use_rule_reward": Rule(ALIAS, "reward_funcs", "true: reward_funcs [\"gsm8k\"], PaddleNLP's gsm8k rule reward "
                                                   "(1 when the number after the last '#### ' equals the row's "
                                                   "tgt / answer, else 0); it replaces a reward model or server, as "
                                                   "in PaddleNLP"),
    "use_tgt_len_value": Rule(REFUSE, None, "values over the target length are not built"),
    "stage": Rule(NOTICE, None, "the entry point names the stage here (run_sft.py, run_reward.py, run_dpo.py, "
                                "run_kto.py, run_ppo.py), not this key", inert=one_of("PPO")),
    "dropout_warmup_steps": Rule(REFUSE, None, "this toolkit's models train without dropout"),
    "hidden_dropout_prob": Rule(REFUSE, None, "this toolkit's models train without dropout (LoRA has lora_dropout)"),
    "attention_probs_dropout_prob": Rule(REFUSE, None, "this toolkit's models train without dropout"),
    "autotuner_benchmark": Rule(REFUSE, None, "the autotuner's benchmark (a model from scratch, rows padded to "
                                              "max_length) is not built; benchmark: true measures the real run"),

    # ---- DPO and LoRA ----
    "pref_loss_ratio": Rule(REFUSE, None, "the preference loss has weight 1 here; give the SFT term's relative "
                                          "weight sft_loss_ratio / pref_loss_ratio as nll_loss_coef instead",
                            inert=one_of(1.0)),
    "ref_model_update_steps": Rule(REFUSE, None, "the reference model stays fixed here (no TR-DPO updates)"),
    "weight_quantize_algo": Rule(REFUSE, None, "quantized base weights (QLoRA) are not built; train LoRA on the "
                                               "float32 weights"),
}
