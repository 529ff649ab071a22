"""PaddleFormers (PaddleNLP's successor) argument files: its Megatron-style key names are aliases of ours
(alignment/config/paddleformers_table.py) and its example DPO YAML (tests/fixtures/paddleformers/dpo_full.yaml)
trains one step on the tiny model with PaddleNLP-format ('erniekit') pairs, only paths and sizes changed."""
import json
import math
import os
import re

import pytest

from alignment.config.data import DataArguments, LoRAArguments, ModelArguments
from alignment.config.dpo import DPOArguments
from alignment.config.parser import ArgumentError, ArgumentParser
from alignment.config.training import TrainingArguments
from tests.helpers import REPO, read_metrics
from tests.data.test_paddlenlp_data import PAIR_ROWS, write_jsonl

DPO_CLASSES = (ModelArguments, DataArguments, DPOArguments, LoRAArguments, TrainingArguments)
FULL_YAML = os.path.join(REPO, "tests", "fixtures", "paddleformers", "dpo_full.yaml")
BASE = {"model_name_or_path": "m", "train_dataset_path": "a.jsonl"}


def parse(**values):
    return ArgumentParser(*DPO_CLASSES).parse_dict({**BASE, **values})


def test_megatron_style_names_set_our_keys():
    _, data, _, lora, train = parse(tensor_model_parallel_size=2, pipeline_model_parallel_size=2,
                                    sharding_parallel_size=4, eval_dataset_path="b.jsonl", fine_tuning="full")
    assert (train.tensor_parallel_degree, train.pipeline_parallel_degree, train.sharding_parallel_degree) == (2, 2, 4)
    assert (data.train_datasets, data.eval_datasets, lora.lora) == ("a.jsonl", "b.jsonl", False)
    assert parse(fine_tuning="lora")[3].lora is True
    with pytest.raises(ArgumentError, match="keys 'tensor_model_parallel_size' and 'tensor_parallel_degree' both set"):
        parse(tensor_model_parallel_size=2, tensor_parallel_degree=4)


def test_data_keys_accepted_when_they_mean_concatenation_and_refused_otherwise():
    parse(train_dataset_type="erniekit", train_dataset_prob="0.5,0.5", mix_strategy="concat", packing=False)
    with pytest.raises(ArgumentError) as info:
        parse(train_dataset_type="sharegpt", train_dataset_prob="0.7,0.3", mix_strategy="interleave_under")
    message = str(info.value)
    assert "key 'train_dataset_type': this toolkit reads a file in the format its keys show" in message
    assert "key 'train_dataset_prob': files are concatenated here" in message and "key 'mix_strategy'" in message


def test_paddleformers_dpo_yaml_trains_one_step_on_erniekit_pairs(tmp_path, tiny_model_dir, capsys):
    from alignment.dpo import run_dpo

    data = write_jsonl(tmp_path / "train.jsonl", PAIR_ROWS)
    out = tmp_path / "out"
    run_dpo.main([FULL_YAML, "--model_name_or_path", tiny_model_dir, "--train_dataset_path", data,
                  "--eval_dataset_path", "", "--output_dir", str(out), "--max_steps", "1", "--max_seq_len", "64",
                  "--gradient_accumulation_steps", "1", "--sharding", ""])
    notices = {re.match(r"notice: key '(\w+)'", line).group(1)
               for line in capsys.readouterr().out.splitlines() if line.startswith("notice: key")}
    assert {"template", "_attn_implementation", "moe_token_dispatcher_type", "save_checkpoint_format",
            "stage", "save_safetensors"} <= notices
    args = json.load(open(out / "args.json"))
    assert (args["loss_type"], args["lora"], args["train_datasets"], args["seed"]) == ("sigmoid", False, data, 23)
    (row,) = read_metrics(out)
    assert row["step"] == 1 and row["loss"] == pytest.approx(math.log(2), rel=1e-6)  # policy == reference: -log s(0)
