import json

import pytest

from alignment.config.parser import ArgumentError, ArgumentParser, parse_flags, to_dict
from alignment.config.data import DataArguments, ModelArguments
from alignment.config.training import TrainingArguments


def parser():
    return ArgumentParser(ModelArguments, DataArguments, TrainingArguments)


def write(tmp_path, data, name="args.json"):
    path = tmp_path / name
    path.write_text(json.dumps(data) if isinstance(data, dict) else data)
    return str(path)


BASE = {"model_name_or_path": "m", "train_datasets": "alpaca"}


def test_json_file_then_flag_overrides(tmp_path):
    path = write(tmp_path, {**BASE, "learning_rate": 1e-4, "max_steps": 5})
    model, data, train = parser().parse_args([path, "--max_steps", "7", "--disable_tqdm", "--eval_datasets=a,b"])
    assert (model.model_name_or_path, train.learning_rate, train.max_steps) == ("m", 1e-4, 7)
    assert train.disable_tqdm is True and data.eval_datasets == "a,b"
    assert to_dict(model, data, train)["max_steps"] == 7


def test_unknown_key_names_key_file_and_suggestion(tmp_path):
    path = write(tmp_path, {**BASE, "learning_rat": 1e-4})
    with pytest.raises(ArgumentError, match=r"args\.json: unknown key 'learning_rat'; did you mean learning_rate"):
        parser().parse_args([path])


def test_wrong_type_names_key(tmp_path):
    path = write(tmp_path, {**BASE, "max_steps": "many"})
    with pytest.raises(ArgumentError, match=r"args\.json: key 'max_steps': expected an integer, got 'many'"):
        parser().parse_args([path])
    with pytest.raises(ArgumentError, match=r"key 'recompute': expected true or false"):
        parser().parse_args([write(tmp_path, {**BASE, "recompute": "maybe"})])


def test_contradicting_values_are_rejected(tmp_path):
    path = write(tmp_path, {**BASE, "learning_rate": 1e-5, "min_learning_rate": 1e-3})
    with pytest.raises(ArgumentError, match="min_learning_rate"):
        parser().parse_args([path])
    with pytest.raises(ArgumentError, match="lr_scheduler_type"):
        parser().parse_args([write(tmp_path, {**BASE, "lr_scheduler_type": "cosin"})])


def test_missing_required_key_and_bad_files(tmp_path):
    with pytest.raises(ArgumentError, match="missing required key 'model_name_or_path'"):
        parser().parse_args([write(tmp_path, {"train_datasets": "alpaca"})])
    with pytest.raises(ArgumentError, match=r"broken\.json line 2: invalid JSON: "):
        parser().parse_args([write(tmp_path, '{"a": 1,\n oops}', "broken.json")])
    with pytest.raises(ArgumentError, match=r"nope\.json: argument file not found"):
        parser().parse_args([str(tmp_path / "nope.json")])
    with pytest.raises(ArgumentError, match="one JSON object"):
        parser().parse_args([write(tmp_path, "[1, 2]", "list.json")])


def test_flags_parsing_and_integer_float_coercion():
    assert parse_flags(["--a", "1", "--b=x", "--flag", "--c", "2"]) == {"a": "1", "b": "x", "flag": "true", "c": "2"}
    _, data, _ = parser().parse_args(["--model_name_or_path", "m", "--train_datasets", '["a:0.5", "b"]'])
    assert data.train_datasets == ["a:0.5", "b"]
    _, data, _ = parser().parse_args(["--model_name_or_path", "m", "--train_datasets", "x",
                                      "--user_dataset_modules", '["a.py", "b.py"]'])
    assert data.user_dataset_modules == ["a.py", "b.py"]  # a plain List[str] field takes JSON too
    _, data, _ = parser().parse_args(["--model_name_or_path", "m", "--train_datasets", "x",
                                      "--user_dataset_modules", "a.py,b.py"])
    assert data.user_dataset_modules == ["a.py", "b.py"]
    _, _, train = parser().parse_dict({**BASE, "num_train_epochs": 2, "max_steps": 3.0})
    assert train.num_train_epochs == 2.0 and train.max_steps == 3
    with pytest.raises(ArgumentError, match="expected an integer, got 3.5"):
        parser().parse_dict({**BASE, "max_steps": 3.5})


def test_every_argument_is_documented():
    text = parser().format_help("python alignment/sft/run_sft.py")
    for cls in (ModelArguments, DataArguments, TrainingArguments):
        for name, f in cls.__dataclass_fields__.items():
            assert f.metadata.get("help"), name
            assert f"--{name} " in text
    assert text.startswith("usage: python alignment/sft/run_sft.py ARGS.{json,yaml} [--key value ...]")
    assert "Optional" not in text and "Union" not in text and "typing" not in text
    assert "--resume_from_checkpoint str or null (default: null)" in text
    assert max(len(line) for line in text.splitlines()) <= 100
    assert "\n  Optimizer:\n  --learning_rate float (default: 2e-05)" in text  # sections of TrainingArguments



def test_help_after_an_argument_file_prints_help(tmp_path, capsys):
    with pytest.raises(SystemExit) as done:
        parser().parse_args([write(tmp_path, BASE), "--help"], prog="python run.py")
    assert done.value.code == 0 and "usage: python run.py" in capsys.readouterr().out


def test_every_shipped_argument_file_parses():
    import glob
    import os

    from alignment.config.data import LoRAArguments
    from alignment.config.dpo import DPOArguments
    from alignment.config.ppo import PPOArguments, PPODataArguments, PPOModelArguments
    from alignment.config.reward import RewardArguments
    from tests.helpers import REPO

    from alignment.config.asynchronous import AsyncArguments
    from alignment.config.distill import DistillArguments, DistillPPOArguments
    from alignment.config.environment import EnvironmentArguments

    rl = ArgumentParser(PPOModelArguments, PPODataArguments, PPOArguments, DistillArguments, EnvironmentArguments,
                        AsyncArguments, LoRAArguments, TrainingArguments)
    parsers = {
        "sft_argument.json": ArgumentParser(ModelArguments, DataArguments, LoRAArguments, TrainingArguments),
        "rm_argument.json": ArgumentParser(ModelArguments, DataArguments, RewardArguments, LoRAArguments,
                                           TrainingArguments),
        "ppo_argument.json": rl,
        "grpo_argument.json": rl,
        "rloo_argument.json": rl,
        **{f"{first_word}_argument.json": rl for first_word in ("dr", "reinforce", "dapo", "gspo", "vapo")},
        "grpo_tools_argument.json": rl,
        "distill_argument.json": ArgumentParser(PPOModelArguments, PPODataArguments, DistillPPOArguments,
                                                DistillArguments, EnvironmentArguments, AsyncArguments,
                                                LoRAArguments, TrainingArguments),
        "dpo_argument.json": ArgumentParser(ModelArguments, DataArguments, DPOArguments, LoRAArguments,
                                            TrainingArguments),
    }
    files = sorted(glob.glob(os.path.join(REPO, "config", "*", "*.json")))
    assert len(files) >= 6
    for path in files:  # by the name's first word: grpo_tools_argument.json, sft_direct_argument.json, ...
        parsers[os.path.basename(path).split("_")[0] + "_argument.json"].parse_args([path])


def test_yaml_files_paddlenlp_flags_and_empty_strings(tmp_path):
    path = write(tmp_path, "model_name_or_path: m\ntrain_datasets: alpaca\nlearning_rate: 1e-4\n"
                           "recompute: 1\ndisable_tqdm: 'True'\nresume_from_checkpoint: ''\nmax_steps: 5\n",
                 "args.yaml")
    model, data, train = parser().parse_args([path, "--max_steps", "7"])
    assert (train.learning_rate, train.max_steps, train.recompute, train.disable_tqdm) == (1e-4, 7, True, True)
    assert train.resume_from_checkpoint is None  # "" = unset, as PaddleNLP writes it
    _, _, train = parser().parse_dict({**BASE, "recompute": 0, "do_eval": 1})
    assert (train.recompute, train.do_eval) == (False, True)
    with pytest.raises(ArgumentError, match="expected true or false, got 2"):
        parser().parse_dict({**BASE, "recompute": 2})


def test_duplicate_keys_are_refused_in_json_and_yaml(tmp_path):
    with pytest.raises(ArgumentError, match=r"args\.json line 1: key 'max_steps' is given twice"):
        parser().parse_args([write(tmp_path, '{"model_name_or_path": "m", "max_steps": 1, "max_steps": 2}')])
    with pytest.raises(ArgumentError, match=r"args\.yaml: key 'seed' is given twice \(line 1\)"):
        parser().parse_args([write(tmp_path, "seed: 1\nseed: 2\n", "args.yaml")])
    with pytest.raises(ArgumentError, match=r"args\.yaml: not valid YAML at line 2"):
        parser().parse_args([write(tmp_path, "seed: 1\n  - oops: [\n", "args.yaml")])


def test_five_mistakes_are_reported_in_one_run(tmp_path):
    path = write(tmp_path, {**BASE, "learning_rat": 1e-4, "max_steps": "many", "adam_beta2": 1.5,
                            "seed": -1, "weight_decay": float("nan")})
    with pytest.raises(ArgumentError) as info:
        parser().parse_args([path])
    message = str(info.value)
    assert "5 problems" in message and "\n" not in message
    for fragment in ("unknown key 'learning_rat'; did you mean learning_rate", "key 'max_steps': expected an integer",
                     "key 'adam_beta2' must be < 1, got 1.5", "key 'seed' must be >= 0, got -1",
                     "key 'weight_decay': expected a finite number, got nan"):
        assert fragment in message


PPO_BASE = {"actor_model_name_or_path": "m", "train_datasets": "x", "reward_funcs": ["sentiment"]}


def ppo_parser():
    from alignment.config.data import LoRAArguments
    from alignment.config.ppo import PPOArguments, PPODataArguments, PPOModelArguments

    return ArgumentParser(PPOModelArguments, PPODataArguments, PPOArguments, LoRAArguments, TrainingArguments)


def test_five_mistakes_among_paddlenlp_keys_are_reported_in_one_run(tmp_path, capsys):
    path = write(tmp_path, "actor_model_name_or_path: m\ntrain_datasets: x\nreward_funcs: [sentiment]\n"
                           "use_flash_attention: true\nmax_dec_len: 16\nglobal_batch_size: 2\nrecompute: 1\n"
                           "rollout_m: 4\nrollout_n: many\nevaluation_strategy: sometimes\nuse_rule_reward: true\n"
                           "rl_algorithm: grpo\nadvantage_estimator: rloo\n", "args.yaml")
    with pytest.raises(ArgumentError) as info:
        ppo_parser().parse_args([path])
    message = str(info.value)
    assert "5 problems" in message and "\n" not in message
    for fragment in ("unknown key 'rollout_m'; did you mean rollout_n",
                     "key 'num_return_sequences': expected an integer, got 'many' (set by 'rollout_n')",
                     "key 'evaluation_strategy': must be one of ['no', 'steps', 'epoch'], got 'sometimes'",
                     "keys 'use_rule_reward' and 'reward_funcs' both set 'reward_funcs', to ['gsm8k'] and "
                     "['sentiment']",
                     "keys 'rl_algorithm' and 'advantage_estimator' both set 'advantage_estimator', to 'grpo' and "
                     "'rloo'"):
        assert fragment in message
    assert "notice" not in capsys.readouterr().out  # a refused file prints no notices


def test_paddlenlp_spellings_of_our_keys_values(tmp_path, monkeypatch, capsys):
    _, _, train = parser().parse_dict({**BASE, "tensor_parallel_degree": -1, "pipeline_parallel_degree": "-1",
                                       "save_total_limit": None, "eval_steps": "", "bf16": 1, "fp16_opt_level": "O0",
                                       "amp_custom_black_list": "reduce_sum softmax_with_cross_entropy",
                                       "evaluation_strategy": "steps", "logging_steps": 5, "save_strategy": "steps"})
    assert (train.tensor_parallel_degree, train.pipeline_parallel_degree, train.save_total_limit) == (1, 1, 0)
    assert (train.bf16, train.fp16_opt_level) == (False, "O1")  # O0 is float32
    assert train.amp_custom_black_list == ["reduce_sum", "softmax_with_cross_entropy"]
    assert (train.eval_steps, train.save_steps) == (5, 500)  # PaddleNLP's fallbacks: logging_steps, 500
    assert "notice: key 'fp16_opt_level': O0 is float32: bf16 mixed precision is off" in capsys.readouterr().out
    _, _, train = parser().parse_dict({**BASE, "evaluation_strategy": "no", "eval_steps": 100,
                                       "save_strategy": "epoch", "save_steps": 100, "num_train_epochs": 1})
    assert (train.eval_steps, train.save_steps) == (0, 0)
    assert "notice" not in capsys.readouterr().out  # one epoch: 'once per epoch' is exactly 'at the end'
    monkeypatch.setenv("PADDLE_TRAINERS_NUM", "2")
    _, _, ppo, _, train = ppo_parser().parse_dict({**PPO_BASE, "global_batch_size": 8, "global_mini_batch_size": 4,
                                                   "rollout_n": 2, "per_device_train_batch_size": 2})
    assert (ppo.per_device_prompt_batch_size, ppo.num_return_sequences, train.gradient_accumulation_steps) == (4, 2, 2)
    with pytest.raises(ArgumentError, match="key 'global_batch_size': 3 prompts do not divide over 2 data-parallel"):
        ppo_parser().parse_dict({**PPO_BASE, "global_batch_size": 3})


def test_paddlenlp_notices_are_one_line_each_and_only_for_values_that_ask_for_something(capsys):
    parser().parse_dict({**BASE, "use_flash_attention": False, "sequence_parallel": 0, "recompute_granularity":
                         "core_attn", "recompute": False, "unified_checkpoint_config": "", "do_train": True})
    assert capsys.readouterr().out == ""
    parser().parse_dict({**BASE, "use_flash_attention": 1, "use_fused_rms_norm": "True", "recompute": True,
                         "recompute_granularity": "core_attn", "sequence_parallel": True})
    lines = capsys.readouterr().out.splitlines()
    assert [line.split("'")[1] for line in lines] == ["use_flash_attention", "use_fused_rms_norm",
                                                      "recompute_granularity", "sequence_parallel"]
    assert all(line.startswith("notice: key '") for line in lines)
    assert "whole decoder layers ('full')" in lines[2] and "tensor_parallel_degree 1" in lines[3]
    with pytest.raises(ArgumentError, match=r"key 'do_train': the run_\*\.py entry points always train"):
        parser().parse_dict({**BASE, "do_train": False})


def test_yaml_alias_bombs_huge_files_and_non_string_keys_are_refused_in_bounded_memory(tmp_path):
    import tracemalloc

    lines = ['a: &a ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    lines += [f"{chr(98 + i)}: &{chr(98 + i)} [{', '.join([f'*{chr(97 + i)}'] * 9)}]" for i in range(8)]
    bomb = write(tmp_path, "\n".join(lines) + "\n", "bomb.yaml")  # 9**9 strings once expanded
    tracemalloc.start()
    with pytest.raises(ArgumentError, match=r"bomb\.yaml: line 2: YAML aliases \(\*a\) are not accepted"):
        parser().parse_args([bomb])
    assert tracemalloc.get_traced_memory()[1] < 20 * 2 ** 20
    tracemalloc.stop()
    huge = write(tmp_path, json.dumps({**BASE, "x": "y" * (1 << 20)}), "huge.json")
    with pytest.raises(ArgumentError, match=r"huge\.json: 1,048,640 bytes, larger than an argument file may be "
                                            r"\(1,048,576\)"):
        parser().parse_args([huge])
    with pytest.raises(ArgumentError, match=r"keys\.yaml: key 1 is not a string"):
        parser().parse_args([write(tmp_path, "model_name_or_path: m\n1: 2\n", "keys.yaml")])
