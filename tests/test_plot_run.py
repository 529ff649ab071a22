"""tools/plot_run.py draws a run's curves to a PNG and describes their trends."""
import json

import pytest

from tools import plot_run


def write_metrics(path, rows):
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))


def test_a_ppo_run_report_is_a_png_with_the_logged_curves(tmp_path):
    rows = [{"step": s, "reward/mean": 0.1 * s, "kl": 0.01 * s, "actor_loss": 1.0 / s, "response_length": 10.0}
            for s in range(1, 9)]
    write_metrics(tmp_path / "metrics.jsonl", rows + [{"step": 8, "eval/reward": 0.9, "eval/gold_reward": 0.7}])
    path, lines = plot_run.plot_run(str(tmp_path))
    assert open(path, "rb").read(8) == b"\x89PNG\r\n\x1a\n"
    described = {line.split(":")[0]: line for line in lines}
    assert set(described) == {"reward/mean", "eval/reward", "eval/gold_reward", "kl", "actor_loss",
                              "response_length"}
    assert described["reward/mean"].startswith("reward/mean: rose 0.15 -> 0.75")  # means of first/last 2 points
    assert "fell" in described["actor_loss"] and "stayed flat" in described["response_length"]


def test_a_broken_metrics_line_is_named(tmp_path, capsys):
    (tmp_path / "metrics.jsonl").write_text('{"step": 1, "loss": 1.0}\n{"step": 2, "loss": \n')
    with pytest.raises(SystemExit) as info:
        plot_run.main([str(tmp_path)])
    assert info.value.code == 2 and "metrics.jsonl line 2" in capsys.readouterr().err


def test_a_directory_without_metrics_is_a_clear_error(tmp_path, capsys):
    with pytest.raises(SystemExit):
        plot_run.main([str(tmp_path)])
    assert "no such file" in capsys.readouterr().err


def test_metrics_of_different_scales_get_their_own_axes():
    for pair in (("actor_loss", "critic_loss"), ("kl", "approx_kl")):
        assert not any(set(pair) <= set(keys) for _, keys in plot_run.PANELS), pair
