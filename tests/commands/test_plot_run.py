"""tools/plot_run.py draws a run's curves to a PNG and describes their trends."""
import json

import pytest

from alignment.commands import plot_run


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


def test_smoothing_is_a_debiased_moving_average():
    # weight 0.5: s1 = 0.5*1 / 0.5 = 1; s2 = (0.25 + 0.5*3) / 0.75 = 2.333...; s3 = (0.875 + 0.5*2) / 0.875
    assert plot_run.smoothed([1.0, 3.0, 2.0], 0.5) == pytest.approx([1.0, 1.75 / 0.75, 1.875 / 0.875])
    assert plot_run.smoothed([4.0, 4.0, 4.0], 0.9) == pytest.approx([4.0, 4.0, 4.0])  # no pull toward 0
    assert plot_run.smoothing_weight(4) == 0.0 and plot_run.smoothing_weight(10) == 0.5
    assert plot_run.smoothing_weight(200) == 0.9 and plot_run.smoothing_weight(40) == pytest.approx(0.75)


def test_the_report_of_a_ppo_fixture_has_one_panel_per_quantity(tmp_path):
    rows = [{"step": s, "reward/mean": 0.1 * s, "kl": 0.3 * s, "approx_kl": 0.001 * s, "actor_loss": 0.02,
             "critic_loss": 2.0 / s, "gold_reward/mean": 0.05 * s} for s in range(1, 31)]
    rows += [{"step": s, "eval/reward": 0.1 * s, "eval/gold_reward": 0.04 * s} for s in (0, 15, 30)]
    write_metrics(tmp_path / "metrics.jsonl", rows)
    series = plot_run.read_series(str(tmp_path / "metrics.jsonl"))
    assert plot_run.panels_for(series) == [
        ("reward (proxy)", ["reward/mean", "eval/reward"]),
        ("gold reward (judge)", ["gold_reward/mean", "eval/gold_reward"]),
        ("KL to reference (summed over the response)", ["kl"]),
        ("policy change per token (approx_kl)", ["approx_kl"]),
        ("actor loss", ["actor_loss"]),
        ("critic loss", ["critic_loss"])]
    path, _ = plot_run.plot_run(str(tmp_path), str(tmp_path / "report.png"))
    import matplotlib.image

    height, width = matplotlib.image.imread(path).shape[:2]
    assert (width, height) == (1080, 864)  # 2 columns x 3 rows of panels at 90 dpi
