"""Several LoRA adapters trained in one SFT run on one frozen base (key lora_adapters, alignment/sft/multi_adapter.py):
each adapter's saved tensors and logged metrics are the same bits as a run of its own with the entry's keys; bad
entries are one error line naming the key."""
import json
import os

import numpy as np
import pytest
from safetensors.numpy import load_file

from alignment.sft import run_sft
from tests.helpers import REPO, read_metrics

SFT_CONFIG = os.path.join(REPO, "config", "tiny", "sft_argument.json")
TRAIN, OTHER = (f"alpaca:1.0:{REPO}/data/sft/{name}.jsonl" for name in ("train", "eval"))
COMMON = ["--disable_tqdm", "--eval_datasets", "", "--max_steps", "3", "--logging_steps", "1",
          "--per_device_train_batch_size", "4", "--lora", "true", "--lora_rank", "4", "--lora_alpha", "8"]
# entries that differ in data, learning rate, seed, rank, targets and steps
ENTRIES = [{"name": "plain", "train_datasets": TRAIN, "seed": 1},
           {"name": "other-data", "train_datasets": OTHER, "learning_rate": 1e-2, "seed": 2, "lora_rank": 8,
            "lora_target_modules": ["q_proj", "v_proj"]},
           {"name": "shorter", "train_datasets": TRAIN, "seed": 3, "max_steps": 2, "lora_alpha": 16}]
FLAGS = {"train_datasets": "--train_datasets", "learning_rate": "--learning_rate", "seed": "--seed",
         "lora_rank": "--lora_rank", "lora_target_modules": "--lora_target_modules", "max_steps": "--max_steps",
         "lora_alpha": "--lora_alpha"}


def sft(model, output_dir, *extra):
    return run_sft.main([SFT_CONFIG, "--model_name_or_path", model, "--output_dir", str(output_dir), *COMMON,
                         *extra])


def alone(model, output_dir, entry):
    """A run of its own with the entry's keys."""
    flags = [part for key, value in entry.items() if key != "name"
             for part in (FLAGS[key], json.dumps(value) if isinstance(value, list) else str(value))]
    sft(model, output_dir, *flags)


def test_each_adapter_of_a_joint_run_is_the_bits_of_its_own_run(tmp_path, tiny_model_dir):
    sft(tiny_model_dir, tmp_path / "joint", "--lora_adapters", json.dumps(ENTRIES))
    trained = {}
    for entry in ENTRIES:
        alone(tiny_model_dir, tmp_path / entry["name"], entry)
        joint, own = tmp_path / "joint" / entry["name"], tmp_path / entry["name"]
        got = load_file(str(joint / "model" / "adapter_model.safetensors"))
        want = load_file(str(own / "model" / "adapter_model.safetensors"))
        assert sorted(got) == sorted(want), entry["name"]
        for key in want:
            assert np.array_equal(got[key], want[key]), (entry["name"], key)
        got_rows, want_rows = read_metrics(str(joint)), read_metrics(str(own))
        steps = entry.get("max_steps", 3)
        assert [r["step"] for r in got_rows if "loss" in r] == list(range(1, steps + 1))
        for key in ("loss", "grad_norm", "lr"):
            assert [r[key] for r in got_rows if key in r] == [r[key] for r in want_rows if key in r], key
        config = json.load(open(joint / "model" / "adapter_config.json"))
        assert config == json.load(open(own / "model" / "adapter_config.json"))
        trained[entry["name"]] = got
    a, b = trained["plain"], trained["shorter"]
    key = next(k for k in a if k.endswith("lora_B.weight"))
    assert not np.array_equal(a[key], b[key])  # the entries' seeds, data and steps did make other adapters


@pytest.mark.parametrize("entries, extra, words", [
    (ENTRIES[:1], ["--lora", "false"], "key 'lora_adapters' needs 'lora': true"),
    ([{"name": "a"}], [], "entry 0: missing key 'train_datasets'"),
    ([{"name": "a", "train_datasets": TRAIN, "lr": 1}], [], "entry 0: unknown key 'lr'"),
    ([{"name": "a", "train_datasets": TRAIN, "learning_rate": -1}], [], "key 'learning_rate' must be a positive"),
    ([{"name": "a/b", "train_datasets": TRAIN}], [], "name 'a/b' must be letters"),
    ([ENTRIES[0], ENTRIES[0]], [], "the name 'plain' is given twice"),
])
def test_bad_entries_are_one_error_line_naming_the_key(entries, extra, words, tmp_path, tiny_model_dir, capsys):
    with pytest.raises(SystemExit) as stop:
        sft(tiny_model_dir, tmp_path / "out", "--lora_adapters", json.dumps(entries), *extra)
    err = capsys.readouterr().err.strip().splitlines()
    assert stop.value.code == 2 and len(err) == 1 and "lora_adapters" in err[0] and words in err[0], err
    assert not (tmp_path / "out").exists()


def test_other_stages_refuse_the_key(tmp_path, tiny_model_dir, capsys):
    from alignment.dpo import run_dpo

    config = os.path.join(REPO, "config", "tiny", "dpo_argument.json")
    with pytest.raises(SystemExit) as stop:
        run_dpo.main([config, "--model_name_or_path", tiny_model_dir, "--output_dir", str(tmp_path / "out"),
                      "--lora", "true", "--lora_adapters", json.dumps(ENTRIES[:1]), "--max_steps", "1"])
    err = capsys.readouterr().err.strip().splitlines()
    assert stop.value.code == 2 and "SFT stage only" in err[-1], err
