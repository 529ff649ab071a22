"""SFT end to end on the tiny model and shipped data, plus the user-facing errors of the entry point."""
import json
import os

import numpy as np
import pytest

from alignment.models import LlamaForCausalLM
from alignment.sft import run_sft
from tests.helpers import REPO, read_metrics

SFT_CONFIG = os.path.join(REPO, "config", "tiny", "sft_argument.json")


def run(tmp_path, tiny_model_dir, *extra):
    argv = [SFT_CONFIG, "--model_name_or_path", tiny_model_dir, "--output_dir", str(tmp_path / "out"),
            "--disable_tqdm", "--train_datasets", f"alpaca:1.0:{REPO}/data/sft/train.jsonl",
            "--eval_datasets", f"alpaca:1.0:{REPO}/data/sft/eval.jsonl", *extra]
    return run_sft.main(argv)


def test_sft_lowers_loss_and_writes_outputs(tmp_path, tiny_model_dir):
    results = run(tmp_path, tiny_model_dir, "--max_steps", "24", "--logging_steps", "4", "--eval_steps", "12",
                  "--save_steps", "12", "--save_total_limit", "1")
    out = tmp_path / "out"
    rows = read_metrics(out)
    train = [r for r in rows if "loss" in r]
    assert [r["step"] for r in train] == [4, 8, 12, 16, 20, 24]
    assert train[-1]["loss"] < train[0]["loss"] - 1.0
    assert all(r["tokens_per_sec"] > 0 and r["lr"] > 0 for r in train)
    evals = [r for r in rows if "eval/loss" in r]
    assert [r["step"] for r in evals] == [12, 24] and evals[1]["eval/loss"] < evals[0]["eval/loss"]
    assert results["eval/loss"] == evals[-1]["eval/loss"]
    args = json.load(open(out / "args.json"))
    assert args["max_steps"] == 24 and args["model_name_or_path"] == tiny_model_dir
    assert sorted(d for d in os.listdir(out) if d.startswith("checkpoint-")) == ["checkpoint-12"]
    assert os.listdir(out / "visualdl")
    trained = LlamaForCausalLM.from_pretrained(str(out / "model"))
    start = LlamaForCausalLM.from_pretrained(tiny_model_dir)
    delta = np.abs(trained.model.norm.weight.numpy() - start.model.norm.weight.numpy()).max()
    assert delta > 0 and os.path.exists(out / "model" / "tokenizer.json")


def test_gradient_accumulation_matches_a_bigger_batch(tmp_path, tiny_model_dir):
    """4 x 2 accumulated equals 8 in one pass when every sample has the same number of answer tokens.

    A large adam_epsilon makes the first AdamW update proportional to the gradient instead of its sign.
    """
    data = tmp_path / "same_len.jsonl"
    data.write_text("".join(json.dumps({"instruction": f"Is {w} a colour?", "output": "Yes, it is."}) + "\n"
                            for w in ["red", "blue", "green", "black", "white", "brown", "pink", "grey"]))
    weights = []
    for batch, accum in ((8, 1), (4, 2)):
        out = tmp_path / f"b{batch}"
        run_sft.main([SFT_CONFIG, "--model_name_or_path", tiny_model_dir, "--output_dir", str(out), "--disable_tqdm",
                      "--train_datasets", f"alpaca:1.0:{data}", "--eval_datasets", "", "--max_steps", "1",
                      "--per_device_train_batch_size", str(batch), "--gradient_accumulation_steps", str(accum),
                      "--warmup_steps", "0", "--lr_scheduler_type", "constant", "--adam_epsilon", "1.0"])
        weights.append(LlamaForCausalLM.from_pretrained(str(out / "model")).model.layers[0].mlp.up_proj.weight.numpy())
    np.testing.assert_allclose(weights[0], weights[1], atol=1e-8)
    assert np.abs(weights[0] - LlamaForCausalLM.from_pretrained(tiny_model_dir).model.layers[0].mlp.up_proj.weight.numpy()).max() > 1e-6


def test_user_dataset_from_a_user_file_is_found_by_name(tmp_path, tiny_model_dir, capsys):
    module = tmp_path / "my_datasets.py"
    module.write_text(
        "from alignment.data import RawDataset\n"
        "class Greetings(RawDataset):\n"
        "    NAME = 'my-greetings'\n"
        "    def __init__(self, path=None):\n"
        "        self.rows = [{'input': f'Greet person {i}.', 'answer': f'Hello, person {i}!'} for i in range(6)]\n"
        "    def __getitem__(self, index):\n"
        "        return self.rows[index]\n"
        "    def __len__(self):\n"
        "        return len(self.rows)\n")
    config = tmp_path / "args.json"
    config.write_text(json.dumps({"model_name_or_path": tiny_model_dir, "train_datasets": "my-greetings",
                                  "user_dataset_modules": [str(module)], "output_dir": str(tmp_path / "out"),
                                  "max_steps": 2, "per_device_train_batch_size": 3, "logging_steps": 1,
                                  "disable_tqdm": True}))
    run_sft.main([str(config)])
    assert "train data: my-greetings 6/6" in capsys.readouterr().out
    assert [r["step"] for r in read_metrics(tmp_path / "out")] == [1, 2]


def expect_exit(capsys, argv, *fragments):
    with pytest.raises(SystemExit) as info:
        run_sft.main(argv)
    assert info.value.code == 2
    err = capsys.readouterr().err
    for fragment in fragments:
        assert fragment in err, err


def test_bad_inputs_give_clear_errors_and_write_nothing(tmp_path, tiny_model_dir, capsys):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"instruction": "a", "output": "b"}\n{"instruction": "c"}\n')
    out = tmp_path / "out"
    base = [SFT_CONFIG, "--model_name_or_path", tiny_model_dir, "--output_dir", str(out)]
    expect_exit(capsys, base + ["--train_datasets", f"alpaca:1.0:{bad}"], "bad.jsonl", "line 2", "output")
    expect_exit(capsys, base + ["--train_datasets", "no-such-data"], "no-such-data", "alpaca", "PKU-SafeRLHF/train")
    expect_exit(capsys, base + ["--learning_rat", "1"], "unknown key 'learning_rat'", "learning_rate")
    assert not out.exists()


def test_a_second_run_in_the_same_directory_is_refused_unless_it_overwrites(tmp_path, tiny_model_dir, capsys):
    flags = ("--max_steps", "3", "--logging_steps", "1", "--eval_datasets", "", "--save_steps", "2")
    run(tmp_path, tiny_model_dir, *flags)
    capsys.readouterr()
    with pytest.raises(SystemExit) as stop:
        run(tmp_path, tiny_model_dir, *flags)
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert "key 'output_dir'" in err and "holds another run (args.json, checkpoint-2, latest" in err
    assert "overwrite_output_dir" in err and len(err.strip().splitlines()) == 1
    assert [r["step"] for r in read_metrics(tmp_path / "out")] == [1, 2, 3]  # nothing of the first run touched
    assert (tmp_path / "out" / "checkpoint-2").is_dir()

    run(tmp_path, tiny_model_dir, "--max_steps", "2", "--logging_steps", "1", "--eval_datasets", "",
        "--overwrite_output_dir", "true")
    assert [r["step"] for r in read_metrics(tmp_path / "out")] == [1, 2]
    assert not (tmp_path / "out" / "checkpoint-2").exists() and not (tmp_path / "out" / "latest").exists()
