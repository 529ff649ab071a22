"""examples/main_demo_seeds/report.py: each arm over its training seeds from alignment-eval's files (seeds read from
the evaluated policy's args.json), the difference paired by prompt, and whether the arms' intervals overlap."""
import json

import pytest

from alignment.evaluation.metrics import bootstrap_ci, seeds_and_items_ci, seeds_and_items_difference_ci
from examples.main_demo_seeds import report


def evaluation(tmp_path, name: str, scores: list, seed=None) -> str:
    """An evaluation directory as alignment-eval writes it, of a policy whose run's args.json holds `seed`."""
    policy = tmp_path / f"run-{name}" / "policy"
    policy.mkdir(parents=True)
    if seed is not None:
        (policy.parent / "args.json").write_text(json.dumps({"seed": seed}))
    out = tmp_path / name
    out.mkdir()
    (out / "run.json").write_text(json.dumps({"policy": str(policy), "task": "dialogue_gold"}))
    rows = [{"index": i, "metrics": {"mean@1": s}} for i, s in reversed(list(enumerate(scores)))]  # any order
    (out / "items.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(out)


def test_arms_over_seeds_and_their_difference(tmp_path):
    ppo = [[0.2, 0.9, 0.4, 0.6], [0.1, 0.8, 0.5, 0.7], [0.3, 0.7, 0.2, 0.9]]
    dpo = [[0.6, 0.9, 0.5, 0.8], [0.5, 1.0, 0.6, 0.7]]
    ppo_dirs = [evaluation(tmp_path, f"ppo-s{seed}", s, seed) for s, seed in zip(ppo, (42, 1, 2))]
    dpo_dirs = [evaluation(tmp_path, f"dpo-s{seed}", s, seed) for s, seed in zip(dpo, (42, 1))]
    argv = ["--start", evaluation(tmp_path, "sft", [0.1, 0.5, 0.3, 0.5]), "--no-save", "--arm", "PPO", *ppo_dirs,
            "--arm", "DPO", *dpo_dirs]
    figures = report.main(argv)
    arms = {a["arm"]: a for a in figures["arms"]}
    assert [r["seed"] for r in arms["PPO"]["runs"]] == [42, 1, 2]
    assert arms["PPO"]["runs"][1]["gold"]["mean"] == pytest.approx(0.525)
    assert tuple(arms["DPO"]["over_seeds"].values()) == seeds_and_items_ci(dpo)
    assert tuple(arms["PPO"]["runs"][2]["gold"].values()) == bootstrap_ci(ppo[2])
    diff = figures["differences"][0]
    assert diff["arms"] == "DPO - PPO"
    assert (diff["mean"], diff["low"], diff["high"]) == seeds_and_items_difference_ci(ppo, dpo)
    assert diff["intervals_overlap"] == (not (arms["PPO"]["over_seeds"]["high"] < arms["DPO"]["over_seeds"]["low"]))
    assert figures["start"]["gold"]["mean"] == pytest.approx(0.35)


def test_runs_over_different_prompts_are_refused(tmp_path, capsys):
    with pytest.raises(SystemExit, match="arm PPO: the evaluations cover different numbers of prompts"):
        report.main(["--start", evaluation(tmp_path, "sft", [0.1, 0.2]), "--no-save", "--arm", "PPO",
                     evaluation(tmp_path, "a", [0.1, 0.2]), evaluation(tmp_path, "b", [0.1, 0.2, 0.3])])
