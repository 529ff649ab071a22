"""The run monitors (alignment/training/monitors.py) and the run report (alignment/training/run_report.py): each monitor
fires at the step its threshold is crossed and not before, a healthy run fires none, monitor_action stop ends a
run in one line with exit 1, and a run that collapses on purpose (a huge learning rate on a reward for repeating
one character) writes report.md listing its events."""
import json
import math
import os
import subprocess
import sys
import xml.etree.ElementTree as ET

import pytest

from alignment.commands import report
from alignment.config.monitors import MonitorArguments
from alignment.ppo import run_ppo
from alignment.training.monitors import MONITORS, RunMonitors, read_events
from alignment.training.svg_chart import NAMESPACE
from tests.helpers import REPO, read_metrics

SVG = f"{{{NAMESPACE}}}"  # ElementTree's prefix for the SVG namespace

DEFAULTS = MonitorArguments()


def fired(rows, evaluations=None, **keys):
    """{monitor: [steps it fired at]} for per-step metric rows (steps 1, 2, ...); evaluations: {step: metrics}
    given to the monitors after that step's row, as the trainer does."""
    monitors = RunMonitors(MonitorArguments(**keys), "unused", writes=False)
    for step, row in enumerate(rows, 1):
        monitors.observe(step, dict(row))
        if evaluations and step in evaluations:
            monitors.evaluated(step, evaluations[step])
    out = {}
    for event in monitors.events:
        out.setdefault(event["monitor"], []).append(event["step"])
    return out


def test_entropy_collapse_fires_once_when_entropy_falls_below_a_quarter_of_its_baseline():
    rows = [{"entropy": e} for e in (2.0, 2.0, 2.0, 1.0, 0.6, 0.4, 0.3, 0.2)]  # baseline 2.0: fires below 0.5
    assert fired(rows) == {"entropy_collapse": [6]}  # once: it keeps firing, one event
    assert fired([{"entropy": 0.1}] * 3 + [{"entropy": 0.01}]) == {"entropy_collapse": [4]}
    assert fired(rows, monitor_entropy_collapse=0.0) == {}
    early_drop = [{"entropy": e} for e in (4.0, 0.9, 0.9, 0.9)]  # baseline 4.0 (one step) or 1.93 (three)
    assert fired(early_drop, monitor_baseline_steps=1) == {"entropy_collapse": [2]}
    assert fired(early_drop) == {}


def test_kl_spike_against_the_previous_steps_mean():
    rows = [{"kl": k} for k in (0.1, 0.1, 0.1, 0.1, 0.45, 1.0)]  # step 6: 1.0 > 5 x mean(0.1 x 3, 0.45) = 0.9375
    assert fired(rows, monitor_window=4) == {"kl_spike": [6]}
    assert fired(rows) == {}  # the default window (8 steps) is not complete yet
    # a run's first steps (as SmolLM2's GRPO logged them: 0.0 then 0.088): no spike before a full window
    assert fired([{"kl": k} for k in (0.0, 0.088, 0.098)]) == {}
    assert fired([{"kl": k} for k in (0.0, 0.01, 0.04)], monitor_window=2) == {}  # below monitor_kl_floor
    assert fired([{"kl": k} for k in (0.0, 0.01, 0.04)], monitor_window=2, monitor_kl_floor=0.0) == {"kl_spike": [3]}


def test_kl_acceleration_is_the_second_difference():
    rows = [{"kl": k} for k in (1.0, 1.2, 1.4, 1.6, 1.9, 3.3)]  # second differences 0, 0, 0.1, 1.1 at step 6
    assert fired(rows, monitor_kl_spike=0.0) == {"kl_acceleration": [6]}
    assert fired(rows, monitor_kl_spike=0.0, monitor_kl_acceleration=1.2) == {}


def test_length_drift_both_ways():
    assert fired([{"response_length": n} for n in (10, 10, 10, 14, 15, 16)]) == {"length_drift": [6]}
    assert fired([{"response_length": n} for n in (10, 12, 8, 6, 4)]) == {"length_drift": [5]}
    assert fired([{"response_length": n} for n in (10, 10, 10, 14, 15, 16)], monitor_length_drift=0.7) == {}


def test_clip_fraction_and_zero_variance_groups_above_their_limits():
    assert fired([{"clip_frac": c} for c in (0.1, 0.3, 0.31, 0.05, 0.4)]) == {"clip_fraction": [3, 5]}
    assert fired([{"clip_frac": c} for c in (0.1, 0.3, 0.31, 0.05, 0.4)], monitor_clip_fraction=0.35) == {
        "clip_fraction": [5]}
    rows = [{"reward/zero_variance_groups": z} for z in (0.5, 0.9, 1.0)]
    assert fired(rows) == {"zero_variance_groups": [3]}
    assert fired(rows, monitor_zero_variance_groups=0.4) == {"zero_variance_groups": [1]}
    assert fired([{"curriculum/zero_variance_groups": 0.95}]) == {"zero_variance_groups": [1]}


def test_nonfinite_anywhere():
    rows = [{"kl": 0.1, "reward/mean": 0.2}, {"kl": 0.1, "reward/mean": 0.2}, {"kl": 0.1, "reward/mean": math.nan}]
    assert fired(rows) == {"nonfinite": [3]}
    assert fired([{"loss": math.inf}]) == {"nonfinite": [1]}


def test_reward_hacking_against_the_gold_judge():
    rewards = [0.0] * 4 + [0.2] * 4
    flat_gold = [{"reward/mean": r, "gold_reward/mean": 0.5} for r in rewards]
    assert fired(flat_gold) == {"reward_hacking": [8]}  # the first full window; the rise 0.2 > 0.1
    rising_gold = [{"reward/mean": r, "gold_reward/mean": 0.5 + r} for r in rewards]
    assert fired(rising_gold) == {}
    assert fired(flat_gold, monitor_reward_hacking=0.25) == {}
    assert fired(flat_gold, monitor_window=4) == {"reward_hacking": [6]}  # halves [0, 0] and [0.2, 0.2] at step 6


def test_reward_hacking_against_the_held_out_evaluation():
    rows = [{"reward/mean": 0.0}] * 5 + [{"reward/mean": 0.3}] * 4  # steps 1-9
    evaluations = {1: {"eval/reward": 0.3}, 8: {"eval/reward": 0.2}}
    # step 8's window has no evaluation in its second half yet (it runs after the step); step 9's has
    assert fired(rows, evaluations) == {"reward_hacking": [9]}
    assert fired(rows, {1: {"eval/reward": 0.3}, 8: {"eval/reward": 0.5}}) == {}


def test_a_healthy_run_fires_nothing():
    rows = [{"entropy": 2.0 - 0.02 * t, "kl": 0.02 * t, "response_length": 10 + (t % 3), "clip_frac": 0.05,
             "reward/zero_variance_groups": 0.25, "reward/mean": 0.03 * t, "gold_reward/mean": 0.02 * t,
             "loss": 1.0} for t in range(1, 31)]
    assert fired(rows) == {}
    assert set(MONITORS.classes) == {"nonfinite", "entropy_collapse", "kl_spike", "kl_acceleration", "length_drift",
                                     "clip_fraction", "zero_variance_groups", "reward_hacking"}


REPEATS = "def repeats(prompts, completions, **labels):\n" \
          "    return [max(c.count(ch) for ch in set(c)) / len(c) if c else 0.0 for c in completions]\n"


def collapsing_run(out, model, tmp_path, *extra):
    """GRPO at learning rate 0.05, rewarded for repeating one character: the tiny policy's entropy falls from
    ln(vocab) to ~0 within 8 steps."""
    reward = tmp_path / "repeats.py"
    reward.write_text(REPEATS)
    return [os.path.join(REPO, "config", "tiny", "grpo_argument.json"), "--actor_model_name_or_path", model,
            "--output_dir", str(out), "--disable_tqdm", "--reward_funcs", f"{reward}:repeats", "--gold_judge", "",
            "--train_datasets", f"prompt-only:1.0:{REPO}/data/chain_sum/chain_sum_train.jsonl",
            "--eval_datasets", "", "--max_steps", "8", "--max_new_tokens", "8", "--per_device_prompt_batch_size",
            "4", "--num_return_sequences", "4", "--per_device_train_batch_size", "16", "--learning_rate", "0.05",
            "--kl_coeff", "0", *extra]


def entropy_collapsed_at(out) -> int:
    """The first step whose entropy is below monitor_entropy_collapse x the first steps' mean, from metrics.jsonl."""
    entropy = [row["entropy"] for row in read_metrics(out) if "entropy" in row]
    base = sum(entropy[:DEFAULTS.monitor_baseline_steps]) / DEFAULTS.monitor_baseline_steps
    return next(step for step, e in enumerate(entropy, 1)
                if step > DEFAULTS.monitor_baseline_steps and e < DEFAULTS.monitor_entropy_collapse * base)


def test_a_collapsing_run_reports_its_events(tiny_model_dir, tmp_path, capsys):
    out = tmp_path / "run"
    run_ppo.main(collapsing_run(out, tiny_model_dir, tmp_path))
    events = read_events(str(out / "monitor_events.jsonl"))
    collapse = [e for e in events if e["monitor"] == "entropy_collapse"]
    assert [e["step"] for e in collapse] == [entropy_collapsed_at(out)]
    logged = {row["step"]: row for row in read_metrics(out)}
    assert logged[collapse[0]["step"]]["monitor/entropy_collapse"] == pytest.approx(collapse[0]["value"])
    assert f"warning: monitor entropy_collapse fired at step {collapse[0]['step']}" in capsys.readouterr().out
    text = (out / "report.md").read_text()
    for event in events:
        assert f"- monitor {event['monitor']} fired at step {event['step']}:" in text
    for family in ("rewards", "kl", "entropy", "lengths", "timings"):
        assert f"![report_{family}](report_{family}.svg)" in text
        page = ET.parse(out / f"report_{family}.svg").getroot()
        assert page.find(f"{SVG}polyline") is not None
        marked = [t.text for t in page.iter(f"{SVG}text") if t.get("fill") == "red"]  # each event in each panel
        assert sorted(set(marked)) == sorted({e["monitor"] for e in events})
    final_entropy = logged[max(logged)]["entropy"]
    assert f"| entropy | `entropy` | 8 | {final_entropy:.4g} |" in text
    (out / "report.md").unlink()
    done = subprocess.run([sys.executable, os.path.join(REPO, "tools", "report.py"), str(out)],
                          capture_output=True, text=True)
    assert done.returncode == 0 and (out / "report.md").read_text() == text


def test_monitor_action_stop_ends_the_run_in_one_line(tiny_model_dir, tmp_path, capsys):
    out = tmp_path / "run"
    with pytest.raises(SystemExit) as stop:
        run_ppo.main(collapsing_run(out, tiny_model_dir, tmp_path, "--monitor_action", "stop", "--monitor_kl_spike",
                                    "0", "--monitor_kl_acceleration", "0", "--save_steps", "0"))
    assert stop.value.code == 1
    step = entropy_collapsed_at(out)
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"error: monitor entropy_collapse fired at step {step}: value ")
    assert "(monitor_action: stop)" in err[0]
    assert max(row["step"] for row in read_metrics(out)) == step  # the run ended at that step, its row logged
    assert (out / f"checkpoint-{step}").is_dir()
    assert f"monitor entropy_collapse fired at step {step}" in (out / "report.md").read_text()


def test_a_bad_monitor_action_is_an_argument_error(tiny_model_dir, tmp_path, capsys):
    with pytest.raises(SystemExit) as bad:
        run_ppo.main(collapsing_run(tmp_path / "run", tiny_model_dir, tmp_path, "--monitor_action", "pause"))
    assert bad.value.code == 2 and "monitor_action" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()


def test_the_report_command_needs_a_run(tmp_path, capsys):
    with pytest.raises(SystemExit) as missing:
        report.main([str(tmp_path)])
    assert missing.value.code == 2 and "metrics.jsonl: no such file" in capsys.readouterr().err
    (tmp_path / "metrics.jsonl").write_text(json.dumps({"step": 1, "reward/mean": 0.5}) + "\n")
    assert report.main([str(tmp_path)]) == str(tmp_path / "report.md")
    assert "None: no monitor fired." in (tmp_path / "report.md").read_text()


def test_the_report_and_its_pages_need_no_matplotlib(tmp_path):
    rows = [{"step": 1, "reward/mean": 0.5, "entropy": 2.0}, {"step": 2, "reward/mean": float("nan"), "entropy": 1.0}]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    blocked = "import sys; sys.modules['matplotlib'] = None; from alignment.training.run_report import write_report; "
    done = subprocess.run([sys.executable, "-c", blocked + f"write_report({str(tmp_path)!r})"], cwd=REPO,
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "![report_rewards](report_rewards.svg)" in (tmp_path / "report.md").read_text()
    assert sorted(p.name for p in tmp_path.glob("*.svg")) == ["report_entropy.svg", "report_rewards.svg"]
    ET.parse(tmp_path / "report_rewards.svg")


def test_a_resumed_history_fires_as_the_straight_run():
    rows = [{"entropy": e, "reward/zero_variance_groups": 1.0} for e in (2.0, 2.0, 2.0, 1.5, 1.0, 0.4, 0.3, 0.2)]
    straight = RunMonitors(DEFAULTS, "unused", writes=False)
    for step, row in enumerate(rows, 1):
        straight.observe(step, dict(row))
    first = RunMonitors(DEFAULTS, "unused", writes=False)
    for step, row in enumerate(rows[:4], 1):
        first.observe(step, dict(row))
    resumed = RunMonitors(DEFAULTS, "unused", writes=False)
    resumed.load_state_dict(json.loads(json.dumps(first.state_dict())))  # as trainer_state.json holds it
    for step, row in enumerate(rows[4:], 5):
        resumed.observe(step, dict(row))
    assert first.events + resumed.events == straight.events
    assert [(e["monitor"], e["step"]) for e in straight.events] == [("zero_variance_groups", 1),
                                                                   ("entropy_collapse", 6)]
