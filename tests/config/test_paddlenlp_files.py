"""PaddleNLP's own argument files (tests/fixtures/paddlenlp/, copied from PaddlePaddle/PaddleNLP) run one step on the
tiny model with only model / data paths, the reward source, parallel degrees and batch sizes changed on the command
line; every PaddleNLP key is honoured, accepted with a one-line notice, or refused (alignment/config/paddlenlp.py)."""
import json
import os
import re
import subprocess
import sys
import time

import numpy as np
import pytest
from safetensors.numpy import load_file

from alignment.config import paddlenlp
from alignment.config.data import DataArguments, LoRAArguments, ModelArguments
from alignment.config.dpo import DPOArguments
from alignment.config.parser import ArgumentError, ArgumentParser, load_argument_file
from alignment.config.ppo import PPOArguments, PPODataArguments, PPOModelArguments
from alignment.config.reward import RewardArguments
from alignment.config.training import TrainingArguments
from tests.helpers import REPO, read_metrics

FIXTURES = os.path.join(REPO, "tests", "fixtures", "paddlenlp")
PROMPTS = f"prompt-only:1.0:{REPO}/data/prompts/train.jsonl"
PAIRS = f"PKU-SafeRLHF/train:1.0:{REPO}/data/preference"
PPO_CLASSES = (PPOModelArguments, PPODataArguments, PPOArguments, LoRAArguments, TrainingArguments)
NOTICE = re.compile(r"^notice: key '\w+': \S.*$")


def fixture(name):
    return os.path.join(FIXTURES, name)


@pytest.fixture(scope="module")
def reward_server(tiny_reward_dir, tmp_path_factory):
    """tools/reward_server.py serving the tiny reward model (the grpo / reinforce++ files score with a server)."""
    port_file = str(tmp_path_factory.mktemp("rm-server") / "port")
    log = open(port_file + ".log", "w")
    proc = subprocess.Popen([sys.executable, os.path.join(REPO, "tools", "reward_server.py"), "--model",
                             tiny_reward_dir, "--port", "0", "--port-file", port_file],
                            stdout=log, stderr=subprocess.STDOUT, cwd=REPO)
    deadline = time.time() + 120
    while not os.path.exists(port_file):
        assert proc.poll() is None and time.time() < deadline, open(log.name).read()[-2000:]
        time.sleep(0.05)
    time.sleep(0.05)  # the port file is complete once it exists and is non-empty
    yield f"http://127.0.0.1:{int(open(port_file).read())}"
    proc.terminate()
    try:
        proc.wait(timeout=15)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=15)
    log.close()


def run(entry, argv, capsys):
    """Run an entry point's main(argv); the PaddleNLP notices it printed (each one line)."""
    entry.main(argv)
    lines = capsys.readouterr().out.splitlines()
    notices = [line for line in lines if "notice: key" in line]
    for line in notices:
        assert NOTICE.match(line), line
    assert len(notices) == len(set(notices)), "a notice was printed twice"
    return notices


def one_step(out):
    """The run trained exactly one step and saved its model."""
    assert [row["step"] for row in read_metrics(out)] == [1]
    return json.load(open(os.path.join(out, "args.json")))


def keys_of(notices):
    return {re.match(r"notice: key '(\w+)'", line).group(1) for line in notices}


def test_llama_ppo_json_runs_one_step(tmp_path, tiny_model_dir, tiny_reward_dir, capsys):
    from alignment.ppo import run_ppo

    notices = run(run_ppo, [
        fixture("ppo_argument.json"), "--actor_model_name_or_path", tiny_model_dir,
        "--reward_model_name_or_path", tiny_reward_dir, "--train_datasets", PROMPTS, "--eval_datasets", "",
        "--ptx_datasets", f"alpaca:1.0:{REPO}/data/sft/train.jsonl", "--output_dir", str(tmp_path / "out"),
        "--tensor_parallel_degree", "1", "--max_steps", "1", "--max_dec_len", "4"], capsys)
    assert {"use_fusemt", "use_flash_attention", "pipeline_parallel_config", "fused_linear"} <= keys_of(notices)
    assert os.path.isdir(tmp_path / "out" / "vdl_log" / "visualdl")  # its logging_dir, under output_dir
    args = one_step(tmp_path / "out")
    assert (args["advantage_estimator"], args["num_return_sequences"], args["max_new_tokens"]) == ("gae", 1, 4)
    assert (args["eval_steps"], args["save_steps"], args["use_fusemt"]) == (0, 400, False)  # evaluation_strategy no
    assert args["critic_min_learning_rate"] == 2e-7  # honoured: the critic's schedule ends there
    assert args["min_new_tokens"] == 1  # min_dec_len
    # ptx_coeff 16: the SFT loss on the ptx data is logged and trained on (the policy differs from the same step
    # without it, whose rollout is the same)
    assert args["ptx_coeff"] == 16.0 and read_metrics(tmp_path / "out")[0]["ptx_loss"] > 0
    run(run_ppo, [fixture("ppo_argument.json"), "--actor_model_name_or_path", tiny_model_dir,
                  "--reward_model_name_or_path", tiny_reward_dir, "--train_datasets", PROMPTS, "--eval_datasets", "",
                  "--ptx_datasets", "", "--ptx_coeff", "0", "--output_dir", str(tmp_path / "no-ptx"),
                  "--tensor_parallel_degree", "1", "--max_steps", "1", "--max_dec_len", "4"], capsys)
    with_ptx, without = (load_file(str(tmp_path / name / "policy" / "model.safetensors")) for name in ("out", "no-ptx"))
    assert read_metrics(tmp_path / "no-ptx")[0]["reward/mean"] == read_metrics(tmp_path / "out")[0]["reward/mean"]
    assert any(not np.array_equal(with_ptx[k], without[k]) for k in with_ptx)


def test_llama_rm_json_runs_one_step(tmp_path, tiny_model_dir, capsys):
    from alignment.rm import run_reward

    notices = run(run_reward, [
        fixture("rm_argument.json"), "--model_name_or_path", tiny_model_dir, "--train_datasets", PAIRS,
        "--eval_datasets", "", "--output_dir", str(tmp_path / "out"), "--sharding_parallel_degree", "1",
        "--max_steps", "1"], capsys)
    assert {"sharding", "eval_accumulation_steps", "evaluation_strategy", "save_strategy"} <= keys_of(notices)
    args = one_step(tmp_path / "out")
    assert (args["sharding"], args["eval_steps"], args["save_steps"]) == ("", 0, 0)
    assert os.path.isdir(tmp_path / "out" / "model")


def test_llama_dpo_json_runs_one_step(tmp_path, tiny_model_dir, capsys):
    from alignment.dpo import run_dpo

    notices = run(run_dpo, [
        fixture("dpo_argument.json"), "--model_name_or_path", tiny_model_dir, "--train_dataset_path", PAIRS,
        "--dev_dataset_path", "", "--output_dir", str(tmp_path / "out"), "--tensor_parallel_degree", "1",
        "--max_steps", "1"], capsys)
    assert {"max_prompt_len", "use_flash_attention", "flash_mask", "unified_checkpoint"} <= keys_of(notices)
    args = one_step(tmp_path / "out")
    assert args["load_best_model_at_end"] is True  # honoured (no evaluation data here: the last model is kept)
    assert (args["max_length"], args["train_datasets"], args["gradient_accumulation_steps"]) == (4096, PAIRS, 8)


@pytest.mark.parametrize("name, estimator, kl_coeff", [("grpo_argument.yaml", "grpo", 0.0),
                                                        ("reinforce_plus_plus_argument.yaml", "reinforce_plus_plus",
                                                         0.001)])
def test_qwen_rl_yaml_with_a_reward_server_runs_one_step(name, estimator, kl_coeff, tmp_path, tiny_model_dir,
                                                         reward_server, capsys):
    from alignment.ppo import run_ppo

    notices = run(run_ppo, [
        fixture(name), "--actor_model_name_or_path", tiny_model_dir, "--reward_server", reward_server,
        "--train_datasets", PROMPTS, "--eval_datasets", "", "--output_dir", str(tmp_path / "out"),
        "--tensor_parallel_degree", "1", "--max_steps", "1", "--max_dec_len", "4", "--global_batch_size", "2"],
        capsys)
    assert {"dataloader_shuffle", "sequence_parallel", "use_flash_attention",
            "rollout_max_num_seqs"} <= keys_of(notices)
    args = one_step(tmp_path / "out")
    assert (args["prompt_key"], args["response_key"]) == ("src", "tgt")  # ours: the columns of PaddleNLP's rows
    assert (args["advantage_estimator"], args["num_return_sequences"], args["kl_coeff"]) == (estimator, 8, kl_coeff)
    assert args["min_new_tokens"] == 32  # min_dec_len (capped at the 4 new tokens of this run)
    # global_batch_size 2 -> 2 prompts per device; global_mini_batch_size -1 -> 2 x rollout_n 8 / 8 per micro-batch
    assert (args["per_device_prompt_batch_size"], args["gradient_accumulation_steps"]) == (2, 2)
    assert (args["eval_steps"], args["save_steps"], args["use_rm_server"]) == (20, 300, True)
    # ours (tests/ppo/test_dynamic_sampling.py)
    assert (args["dynamic_sampling"], args["max_gen_batches"]) == (False, 2)


def test_qwen_ppo_yaml_runs_one_step_with_its_gsm8k_rule_reward(tmp_path, tiny_model_dir, tiny_reward_dir, capsys):
    """use_rule_reward: true scores with the registered 'gsm8k' reward on PaddleNLP's src / tgt rows."""
    from alignment.ppo import run_ppo

    data = tmp_path / "gsm8k.jsonl"
    data.write_text("".join(json.dumps({"src": f"What is {a} + {a}? Answer after '####'.", "tgt": str(2 * a)}) + "\n"
                            for a in range(1, 5)))
    notices = run(run_ppo, [
        fixture("ppo_argument.yaml"), "--actor_model_name_or_path", tiny_model_dir,
        "--critic_model_name_or_path", tiny_reward_dir, "--train_dataset_path", str(data), "--eval_datasets", "",
        "--output_dir", str(tmp_path / "out"), "--tensor_parallel_degree", "1", "--max_steps", "1",
        "--max_dec_len", "4", "--global_batch_size", "2", "--global_mini_batch_size", "2",
        "--report_to", "visualdl"], capsys)  # the file's wandb is an optional extra (tests/training/test_trackers.py)
    assert {"reward_server", "use_fused_rms_norm", "max_prompt_len"} <= keys_of(notices)
    args = one_step(tmp_path / "out")
    assert (args["advantage_estimator"], args["reward_critic_model_name_or_path"]) == ("gae", tiny_reward_dir)
    assert (args["reward_funcs"], args["use_rm_server"]) == (["gsm8k"], False)
    assert (args["per_device_prompt_batch_size"], args["gradient_accumulation_steps"]) == (2, 1)


def test_the_rule_reward_replaces_a_reward_server_and_conflicts_with_other_reward_funcs():
    values = {"actor_model_name_or_path": "m", "train_datasets": "x", "use_rule_reward": True,
              "use_rm_server": True, "reward_server": "http://127.0.0.1:1"}
    _, _, ppo, _, _ = ArgumentParser(*PPO_CLASSES).parse_dict(values)
    assert (ppo.reward_funcs, ppo.use_rm_server) == (["gsm8k"], False)
    _, _, ppo, _, _ = ArgumentParser(*PPO_CLASSES).parse_dict({**values, "use_rule_reward": False})
    assert (ppo.reward_funcs, ppo.use_rm_server) == ([], True)
    with pytest.raises(ArgumentError, match="keys 'use_rule_reward' and 'reward_funcs' both set 'reward_funcs'"):
        ArgumentParser(*PPO_CLASSES).parse_dict({**values, "reward_funcs": ["accuracy"]})


# The fields of PaddleNLP's argument classes, as read from PaddlePaddle/PaddleNLP: paddlenlp/trainer/training_args.py
# (TrainingArguments, the version with pdc_download_timeout), paddlenlp/rl/utils/config_utils.py and
# llm/alignment/ppo/trainer_utils.py (RL TrainingArguments, ModelArgument, DataArgument), the model switches of
# paddlenlp's llmmetaclass, llm/alignment/dpo/dpo_argument.py, llm/alignment/rm/run_reward.py and
# llm/alignment/rm/flashmask/reward_argument.py.
TRAINING_ARGUMENTS = """output_dir overwrite_output_dir do_train do_eval do_predict do_export evaluation_strategy
prediction_loss_only per_device_train_batch_size per_device_eval_batch_size gradient_accumulation_steps
eval_accumulation_steps learning_rate weight_decay adam_beta1 adam_beta2 adam_epsilon max_grad_norm num_train_epochs
max_steps lr_scheduler_type warmup_ratio warmup_steps num_cycles lr_end power log_on_each_node logging_dir
output_signal_dir logging_strategy logging_first_step logging_steps save_strategy save_steps save_total_limit
save_on_each_node no_cuda seed bf16 fp16 fp16_opt_level amp_master_grad bf16_full_eval fp16_full_eval
amp_custom_black_list amp_custom_white_list sharding sharding_degree sharding_parallel_degree
sharding_parallel_mesh_dimension sharding_comm_buffer_size_MB save_sharded_model load_sharded_model
tensor_parallel_degree pipeline_parallel_degree sep_parallel_degree context_parallel_degree data_parallel_config
sequence_parallel fuse_sequence_parallel_allreduce sequence_parallel_config tensor_parallel_config
pipeline_parallel_config sharding_parallel_config hybrid_parallel_topo_order recompute refined_recompute scale_loss
minimum_eval_times local_rank dataloader_drop_last eval_steps max_evaluate_steps dataloader_num_workers past_index
run_name device disable_tqdm remove_unused_columns label_names load_best_model_at_end metric_for_best_model
greater_is_better ignore_data_skip optim report_to ddp_find_unused_parameters wandb_api_key resume_from_checkpoint
auto_parallel_resume_form_hybrid_parallel skip_memory_metrics flatten_param_grads lazy_data_processing use_async_save
ordered_save_group_size metrics_output_path skip_profile_timer distributed_dataloader unified_checkpoint to_static
unified_checkpoint_config ckpt_quant_stage ignore_load_lr_and_optim ignore_save_lr_and_optim force_reshard_pp
enable_auto_parallel use_expert_parallel expert_max_capacity expert_min_capacity release_grads skip_data_intervals
offload_optim save_sharding_stage1_model_include_freeze_params pdc_download_ckpt pdc_download_timeout""".split()
RL_ARGUMENTS = """global_batch_size global_gen_batch_size global_mini_batch_size per_device_rollout_batch_size
per_device_logprob_batch_size per_device_reward_batch_size per_device_value_batch_size rollout_logprob_batch_size
use_fused_rms_norm kl_coeff kl_loss_coeff pg_loss_coeff entropy_coeff clip_range_ratio clip_range_ratio_low
clip_range_ratio_high clip_range_score enable_overlong_reward_buffer overlong_reward_buffer overlong_penalty_factor
clip_range_value ptx_coeff update_iters critic_learning_rate critic_weight_decay critic_lr_scheduler_type
critic_warmup_ratio critic_recompute normalize_reward normalize_advantage temperature top_p num_return_sequences
rollout_n repetition_penalty rollout_quant_type per_device_prompt_batch_size dynamic_sampling
per_device_sample_batch_size max_gen_batches eval_mode offload_level max_dec_len min_dec_len max_src_len eos_token
use_fusemt recompute_use_reentrant
critic_min_learning_rate critic_decay_steps min_learning_rate decay_steps autotuner_benchmark early_stopping
early_stopping_patience early_stopping_threshold use_fused_head_and_loss_fn tensor_parallel_output dropout_warmup_steps
hidden_dropout_prob attention_probs_dropout_prob rl_algorithm use_tgt_len_value use_rm_server use_rule_reward
use_fp32_compute rollout_tensor_parallel_degree balance_batch use_remove_padding rollout_max_num_seqs
actor_model_name_or_path reward_model_name_or_path reward_server critic_model_name_or_path
reward_critic_model_name_or_path actor_tokenizer_alpha reward_tokenizer_alpha reward_critic_tokenizer_alpha
critic_tokenizer_alpha use_flash_attention use_attn_mask_start_row_indices stage fused_linear recompute_granularity
critic_recompute_granularity chat_template train_datasets eval_datasets eval_split_ratio ptx_datasets max_length
max_prompt_len label_key prompt_key response_key""".split()
LLM_META = """use_flash_attention use_fused_rms_norm use_fused_rope use_fused_linear use_fused_linear_cross_entropy
use_fused_dropout_add fuse_attention_qkv fuse_attention_ffn tensor_parallel_output virtual_pp_degree recompute
recompute_granularity recompute_use_reentrant no_recompute_layers pp_recompute_interval refined_recompute
use_fused_head_and_loss_fn""".split()
DPO_AND_RM_ARGUMENTS = """unified_checkpoint unified_checkpoint_config autotuner_benchmark benchmark beta simpo_gamma
label_smoothing loss_type pref_loss_ratio sft_loss_ratio dpop_lambda ref_model_update_steps reference_free lora
train_dataset_path dev_dataset_path max_seq_len max_prompt_len greedy_zero_padding lazy model_name_or_path
tokenizer_name_or_path use_flash_attention recompute_granularity flash_mask virtual_pp_degree sequence_parallel
tensor_parallel_output weight_quantize_algo lora_rank lora_path rslora lora_plus_scale lora_alpha rslora_plus
use_quick_lora regularization normalize_score_during_training normalizer_type normalizer_momentum dataset_name_or_path
task_name eval_with_do_generation save_generation_output""".split()


def all_our_keys():
    keys = set()
    for classes in (PPO_CLASSES, (ModelArguments, DataArguments, RewardArguments, LoRAArguments, TrainingArguments),
                    (ModelArguments, DataArguments, DPOArguments, LoRAArguments, TrainingArguments)):
        keys |= set(ArgumentParser(*classes).owner)
    return keys


def test_every_field_of_paddlenlps_argument_classes_is_known():
    known = all_our_keys() | set(paddlenlp.TABLE)
    for group in (TRAINING_ARGUMENTS, RL_ARGUMENTS, LLM_META, DPO_AND_RM_ARGUMENTS):
        assert not [key for key in group if key not in known]
    # a table entry is for keys that are not ours; the exceptions name the key that will honour them once it exists
    # (rule.target == key) or serve the stages without it (use_fusemt is PPO's)
    shadowing = [key for key, rule in paddlenlp.TABLE.items() if key in all_our_keys() and rule.target != key]
    assert shadowing == ["use_fusemt"]

def test_every_key_of_the_six_files_is_known():
    for name in sorted(os.listdir(FIXTURES)):
        if name.endswith((".json", ".yaml")):
            unknown = set(load_argument_file(fixture(name))) - all_our_keys() - set(paddlenlp.TABLE)
            assert not unknown, (name, unknown)


def test_an_alias_with_its_target_set_differently_names_both(tmp_path):
    path = tmp_path / "args.yaml"
    path.write_text("actor_model_name_or_path: m\nreward_funcs: [sentiment]\ntrain_datasets: x\n"
                    "rollout_n: 4\nnum_return_sequences: 2\nmax_dec_len: 8\nmax_new_tokens: 8\n"
                    "evaluation_strategy: 'no'\neval_steps: 100\n")
    with pytest.raises(ArgumentError) as info:
        ArgumentParser(*PPO_CLASSES).parse_args([str(path)])
    message = str(info.value)
    assert "keys 'rollout_n' and 'num_return_sequences' both set 'num_return_sequences', to 4 and 2" in message
    assert "max_dec_len" not in message  # the same value under both names is fine
    # a command-line flag replaces the file's value under either name
    _, _, ppo, _, _ = ArgumentParser(*PPO_CLASSES).parse_args([str(path), "--num_return_sequences", "3"])
    assert ppo.num_return_sequences == 3
    _, _, ppo, _, train = ArgumentParser(*PPO_CLASSES).parse_args([str(path), "--rollout_n", "5"])
    assert (ppo.num_return_sequences, train.eval_steps) == (5, 0)  # evaluation_strategy 'no': no evaluation
    _, _, _, _, train = ArgumentParser(*PPO_CLASSES).parse_args([str(path), "--rollout_n", "5", "--eval_steps", "7"])
    assert train.eval_steps == 7  # --eval_steps replaces the file's evaluation_strategy
    _, _, _, _, train = ArgumentParser(*PPO_CLASSES).parse_args([str(path), "--rollout_n", "5",
                                                                 "--evaluation_strategy", "steps"])
    assert train.eval_steps == 100  # ... and --evaluation_strategy keeps the file's eval_steps


def test_paddlenlp_keys_of_another_stage_and_unknown_keys_fail_clearly():
    parser = ArgumentParser(ModelArguments, DataArguments, DPOArguments, LoRAArguments, TrainingArguments)
    with pytest.raises(ArgumentError) as info:
        parser.parse_dict({"model_name_or_path": "m", "train_datasets": "x", "rollout_n": 4, "rollout_m": 2})
    message = str(info.value)
    assert "key 'rollout_n': PaddleNLP's name for 'num_return_sequences', which this stage does not take" in message
    assert "unknown key 'rollout_m'; did you mean rollout_n" in message


def test_report_to_none_turns_the_visualdl_writer_off(tmp_path, tiny_model_dir):
    from alignment.sft import run_sft
    from tests.training.test_resume import sft_args

    _, _, train = ArgumentParser(ModelArguments, DataArguments, TrainingArguments).parse_dict(
        {"model_name_or_path": "m", "train_datasets": "x", "report_to": ["none"]})
    assert train.report_to == []  # PaddleNLP's list form
    run_sft.main(sft_args(tmp_path / "off", tiny_model_dir, "--max_steps", "1", "--report_to", "none"))
    assert not os.path.exists(tmp_path / "off" / "visualdl") and os.path.exists(tmp_path / "off" / "metrics.jsonl")
    run_sft.main(sft_args(tmp_path / "on", tiny_model_dir, "--max_steps", "1"))
    assert os.path.isdir(tmp_path / "on" / "visualdl")


def test_the_docs_migration_tables_list_every_paddlenlp_key():
    text = open(os.path.join(REPO, "docs", "paddlenlp.md"), encoding="utf-8").read()
    missing = [key for key in paddlenlp.TABLE if f"`{key}`" not in text]
    assert not missing, missing
    counts = paddlenlp.kinds()
    assert f"Of the {len(paddlenlp.TABLE)} keys of PaddleNLP and PaddleFormers that are not already ours" in text
    assert f"{counts['alias']} are honoured" in text and f"{counts['notice']} accepted" in text
    assert f"{counts['refuse']} refused" in text


def test_settings_paddlenlp_runs_as_no_ops_are_notices_not_refusals(capsys):
    """ptx_coeff > 0 without ptx data and load_best_model_at_end with evaluation_strategy 'no' run in PaddleNLP
    (nothing to train / nothing to pick): here too, with one line each; our own keys keep their checks."""
    values = {"actor_model_name_or_path": "m", "reward_funcs": ["sentiment"], "train_datasets": "x",
              "ptx_coeff": 16.0, "load_best_model_at_end": True, "evaluation_strategy": "no"}
    _, _, ppo, _, train = ArgumentParser(*PPO_CLASSES).parse_dict(values)
    assert (ppo.ptx_coeff, train.load_best_model_at_end, train.eval_steps) == (0.0, False, 0)
    notices = keys_of([line for line in capsys.readouterr().out.splitlines() if "notice: key" in line])
    assert notices == {"ptx_coeff", "load_best_model_at_end"}
    _, _, ppo, _, train = ArgumentParser(*PPO_CLASSES).parse_dict(
        {**values, "ptx_datasets": "alpaca", "evaluation_strategy": "steps"})
    assert (ppo.ptx_coeff, train.load_best_model_at_end) == (16.0, True)  # honoured when they mean something
    with pytest.raises(ArgumentError, match="'load_best_model_at_end' needs evaluations during training"):
        ArgumentParser(*PPO_CLASSES).parse_dict({**values, "evaluation_strategy": "steps", "eval_steps": 0,
                                                 "ptx_datasets": "alpaca", "do_eval": False})
