"""`benchmark: true` (PaddleNLP's throughput mode, alignment/training/benchmark.py): the steps train as without it,
nothing is evaluated or saved, and the run reports PaddleNLP's [timelog] speed lines and each rank's memory."""
import os
import re

import pytest

from alignment.models import LlamaForCausalLM
from alignment.training.benchmark import Throughput, timelog_lines
from tests.helpers import REPO, read_metrics

FIXTURES = os.path.join(REPO, "tests", "fixtures", "paddlenlp")


def sft_args(model, out, *extra):
    return [os.path.join(REPO, "config", "tiny", "sft_argument.json"), "--model_name_or_path", model,
            "--train_datasets", f"alpaca:1.0:{REPO}/data/sft/train.jsonl",
            "--eval_datasets", f"alpaca:0.4:{REPO}/data/sft/eval.jsonl", "--max_steps", "3", "--save_steps", "1",
            "--eval_steps", "1", "--logging_steps", "10", "--per_device_train_batch_size", "4",
            "--output_dir", str(out), *extra]


def test_benchmark_trains_the_same_steps_saves_nothing_and_reports_speed(tiny_model_dir, tmp_path, capsys):
    from alignment.sft import run_sft

    run_sft.main(sft_args(tiny_model_dir, tmp_path / "plain", "--logging_steps", "1"))
    capsys.readouterr()
    run_sft.main(sft_args(tiny_model_dir, tmp_path / "bench", "--benchmark", "true"))
    out = capsys.readouterr().out
    assert sorted(os.listdir(tmp_path / "bench")) == [".run.lock", "args.json", "metrics.jsonl", "visualdl"]  # no model,
    # no checkpoints despite save_steps 1, and no evaluation despite eval_steps 1 and eval data
    rows = read_metrics(tmp_path / "bench")
    plain = [r for r in read_metrics(tmp_path / "plain") if "loss" in r]
    steps = [r for r in rows if "loss" in r]
    assert [r["step"] for r in steps] == [1, 2, 3]  # every step logged (logging_steps 10; PaddleNLP logs each)
    assert [r["loss"] for r in steps] == [r["loss"] for r in plain]  # the same training, bit for bit
    assert not any(key.startswith("eval/") for row in rows for key in row)
    for row in steps:
        assert row["interval_steps_per_second"] == pytest.approx(1 / row["interval_runtime"])
        assert row["interval_tokens_per_second_per_device"] > 0 and row["interval_samples_per_second"] == \
            pytest.approx(4 / row["interval_runtime"])
    summary = rows[-1]
    ratio = summary["benchmark/effective_ratio"]
    assert 0 < ratio < 1 and summary["benchmark/effective_tokens_per_second"] == pytest.approx(
        ratio * summary["benchmark/tokens_per_second"])
    assert summary["benchmark/step_time"] == pytest.approx(summary["benchmark/train_runtime"] / 3)
    parameters = LlamaForCausalLM.from_pretrained(tiny_model_dir).num_parameters()
    assert summary["benchmark/weights_gib_max"] == pytest.approx(parameters * 4 / 2**30)  # fp32, all trained
    assert summary["benchmark/adamw_gib_max"] == pytest.approx(parameters * 8 / 2**30, rel=1e-3)  # 2 moments
    timelog = re.search(r"\[timelog\] Tokens per second: ([\d.]+) token/s", out)
    assert timelog and float(timelog.group(1)) == pytest.approx(summary["benchmark/tokens_per_second"], abs=0.01)
    assert "[timelog] Effective ratio:" in out and "peak resident memory per rank (GiB):" in out
    assert "nothing evaluated or saved (benchmark: true)" in out and "model saved" not in out


def test_paddlenlp_dpo_file_with_benchmark_true_runs_instead_of_being_refused(tiny_model_dir, tmp_path, capsys):
    from alignment.dpo import run_dpo

    run_dpo.main([os.path.join(FIXTURES, "dpo_argument.json"), "--model_name_or_path", tiny_model_dir,
                  "--train_dataset_path", f"PKU-SafeRLHF/train:1.0:{REPO}/data/preference", "--dev_dataset_path", "",
                  "--output_dir", str(tmp_path / "out"), "--tensor_parallel_degree", "1", "--max_steps", "2",
                  "--benchmark", "true"])
    out = capsys.readouterr().out
    assert "[timelog] Tokens per second:" in out and not os.path.exists(tmp_path / "out" / "model")
    assert [r["step"] for r in read_metrics(tmp_path / "out") if "loss" in r] == [1, 2]


def test_throughput_sums_and_rates_from_recorded_steps():
    speed = Throughput()
    speed.record(2.0, {"samples": 8, "tokens": 300, "padded_tokens": 400})
    speed.record(1.0, {"samples": 8, "tokens": 150, "padded_tokens": 200})
    summary = speed.summary()
    assert summary["benchmark/train_runtime"] == 3.0 and summary["benchmark/step_time"] == 1.5
    assert summary["benchmark/step_time_after_first"] == 1.0
    assert summary["benchmark/tokens_per_second"] == 200.0 and summary["benchmark/effective_tokens_per_second"] == 150
    assert summary["benchmark/effective_ratio"] == 0.75
    lines = timelog_lines(summary, [{"peak_rss": 1.5, "weights": 0.25, "adamw": 0.5}] * 2)
    assert lines[0].startswith("[timelog] Effective ratio: 75.00 % (") and "Tokens per second: 200.00 token/s" in lines[2]
    assert lines[-3:] == ["peak resident memory per rank (GiB): 1.500 1.500",
                          "trained weights held per rank (GiB): 0.250 0.250", "AdamW states held per rank (GiB): 0.500 0.500"]
    uncounted = Throughput()
    uncounted.record(0.5, None)  # a stage that does not count tokens: step time only
    assert set(uncounted.summary()) == {"benchmark/step_time", "benchmark/train_runtime"}
