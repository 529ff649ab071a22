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
    with pytest.raises(ArgumentError, match=r"broken\.json: not valid JSON: .* line 2"):
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
    text = parser().format_help()
    for cls in (ModelArguments, DataArguments, TrainingArguments):
        for name, f in cls.__dataclass_fields__.items():
            assert f.metadata.get("help"), name
            assert f"--{name} " in text


def test_every_shipped_argument_file_parses():
    import glob
    import os

    from alignment.config.data import LoRAArguments
    from alignment.config.dpo import DPOArguments
    from alignment.config.ppo import PPOArguments, PPODataArguments, PPOModelArguments
    from alignment.config.reward import RewardArguments
    from tests.helpers import REPO

    parsers = {
        "sft_argument.json": ArgumentParser(ModelArguments, DataArguments, LoRAArguments, TrainingArguments),
        "rm_argument.json": ArgumentParser(ModelArguments, DataArguments, RewardArguments, LoRAArguments,
                                           TrainingArguments),
        "ppo_argument.json": ArgumentParser(PPOModelArguments, PPODataArguments, PPOArguments, LoRAArguments,
                                            TrainingArguments),
        "grpo_argument.json": ArgumentParser(PPOModelArguments, PPODataArguments, PPOArguments, LoRAArguments,
                                             TrainingArguments),
        "dpo_argument.json": ArgumentParser(ModelArguments, DataArguments, DPOArguments, LoRAArguments,
                                            TrainingArguments),
    }
    files = sorted(glob.glob(os.path.join(REPO, "config", "*", "*.json")))
    assert len(files) >= 6
    for path in files:
        parsers[os.path.basename(path)].parse_args([path])
