"""tools/plot_overoptimization.py: proxy and gold reward against sqrt(KL), and where the gold peaked."""
import json
import math

import pytest

from alignment.commands import plot_overoptimization as po


def write_run(path, kl_coeff, rows):
    path.mkdir()
    (path / "args.json").write_text(json.dumps({"kl_coeff": kl_coeff}))
    (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def test_gold_peak_and_end_are_found_on_a_sqrt_kl_axis(tmp_path, capsys):
    # the proxy keeps rising; the gold rises until step 3, then falls: over-optimisation
    rows = [{"step": s, "kl": kl, "reward/mean": 0.1 * s, "gold_reward/mean": g}
            for s, kl, g in [(1, 0.0, 0.2), (2, 0.25, 0.4), (3, 1.0, 0.6), (4, 2.25, 0.3), (5, 4.0, 0.1)]]
    rows.insert(2, {"step": 2, "eval/reward": 9.0})  # an eval row without the gold is not a point
    rows[:0] = [{"step": 0, "eval/reward": 0.5, "eval/gold_reward": 0.4}]
    rows.append({"step": 5, "eval/reward": 2.5, "eval/gold_reward": 0.05})
    run = write_run(tmp_path / "ppo", 0.05, rows)
    path = po.main([run, "--smooth", "1"])
    assert open(path, "rb").read(4) == b"\x89PNG"
    out = capsys.readouterr().out
    assert "ppo (kl_coeff 0.05): gold peaked at 0.600 (step 3, sqrt KL 1.000)" in out
    assert "ended at sqrt KL 2.000 with proxy 0.500, gold 0.100; held-out proxy 0.500 -> 2.500, gold 0.400 -> 0.050" in out
    c = po.curve(run, 2)
    assert c["held_out"] == [(0.0, 0.5, 0.4), (pytest.approx(math.sqrt(3.125)), 2.5, 0.05)]  # smoothed KL at step 5
    assert c["sqrt_kl"][1] == pytest.approx(math.sqrt(0.125)) and c["gold"][1] == pytest.approx(0.3)


def test_a_run_without_a_gold_judge_is_a_clear_error(tmp_path, capsys):
    run = write_run(tmp_path / "nogold", 0.1, [{"step": 1, "kl": 0.1, "reward/mean": 0.2}])
    with pytest.raises(SystemExit):
        po.main([run])
    assert "has no gold_reward/mean" in capsys.readouterr().err
