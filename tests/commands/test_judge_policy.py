"""tools/judge_policy.py: one policy's held-out gold score, or several side by side with their wall times."""
import json

import pytest

from alignment.commands import judge_policy


def test_comparison_table_shows_gold_length_and_wall_time():
    results = [(0.25, [{"prompt": "p", "completion": "one two", "gold_reward": 0.25}]),
               (0.5, [{"prompt": "p", "completion": "one two three four", "gold_reward": 0.5}])]
    table = judge_policy.comparison_table(["SFT", "RL"], results, [None, 330.7]).splitlines()
    assert table[2] == "| SFT | 0.2500 | 2.0 | - |"
    assert table[3] == "| RL | 0.5000 | 4.0 | 5 min 30 s |"
    shown = judge_policy.side_by_side(["SFT", "RL"], results, 5).splitlines()
    assert shown == ["prompt: 'p'", "  SFT (+0.250): 'one two'", "  RL (+0.500): 'one two three four'"]


def test_several_models_are_judged_on_the_same_prompts(tiny_model_dir, tmp_path, capsys):
    output = tmp_path / "answers.jsonl"
    means = judge_policy.main(["--model", tiny_model_dir, tiny_model_dir, "--label", "A", "B",
                               "--wall-seconds", "-", "61", "--max-new-tokens", "6", "--show", "2",
                               "--output", str(output)])
    rows = [json.loads(line) for line in output.read_text().splitlines()]
    assert [row["label"] for row in rows] == ["A"] * 40 + ["B"] * 40  # the 40 prompts of data/prompts/eval.jsonl
    gold_a = [row["gold_reward"] for row in rows[:40]]
    assert means[0] == pytest.approx(sum(gold_a) / 40) and means[1] == means[0]  # greedy: the same answers
    out = capsys.readouterr().out
    assert f"| A | {means[0]:.4f} |" in out and "| B |" in out and "1 min 01 s |" in out
    assert out.count("prompt: ") == 2


def test_mismatched_labels_and_wall_times_are_refused(tiny_model_dir, capsys):
    with pytest.raises(SystemExit):
        judge_policy.main(["--model", tiny_model_dir, "--label", "A", "B"])
    assert "--label: 2 labels for 1 models" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        judge_policy.main(["--model", tiny_model_dir, "--wall-seconds", "ten"])
    assert "--wall-seconds" in capsys.readouterr().err
