"""tools/show_generations.py shows answers that changed, the biggest (gold) reward moves first."""
import json

from alignment.commands import show_generations


def test_it_shows_changed_answers_biggest_gold_move_first(tmp_path, capsys):
    rows = [{"step": 0, "prompt": "a", "completion": "same", "reward": 0.1, "gold_reward": 0.1},
            {"step": 0, "prompt": "b", "completion": "old b", "reward": 0.2, "gold_reward": 0.2},
            {"step": 0, "prompt": "c", "completion": "old c", "reward": 0.3, "gold_reward": 0.3},
            {"step": 5, "prompt": "a", "completion": "same", "reward": 0.9, "gold_reward": 0.1},
            {"step": 5, "prompt": "b", "completion": "new b", "reward": 0.3, "gold_reward": 0.25},
            {"step": 5, "prompt": "c", "completion": "new c", "reward": 0.4, "gold_reward": 0.9}]
    (tmp_path / "eval_generations.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    show_generations.main([str(tmp_path), "--samples", "3"])
    out = capsys.readouterr().out
    assert "2 of 3 answers changed" in out and "PROMPT: a" not in out  # an unchanged answer is not shown
    assert out.index("PROMPT: c") < out.index("PROMPT: b")  # gold +0.6 before gold +0.05
    assert "new c" in out and "old c" in out
