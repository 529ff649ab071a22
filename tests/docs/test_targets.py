"""The per-CPU targets table (docsgen/targets.py): each figure from the newest run of its benchmark on that CPU that
measured it, marked where it falls short, with a digit more where rounding would hide a miss."""
import json

from benchmarks import record
from docsgen import targets


def save(directory, name, cpu_model, body):
    machine = {"model": "Test CPU", "family": "1", "model_number": cpu_model}
    (directory / name).write_text(json.dumps({"machine": machine, "date": name, "commit": "abc1234", **body}))


def smollm2(train, score, generate):
    return {"rows": [{"workload": w, "ratio": r} for w, r in
                     (("train_step", train), ("score", score), ("generate", generate))]}


def rl_smollm2(algo, ours, trl):
    return {"runs": {algo: {"ours": {"step_s_median": ours}, "trl": {"step_s_median": trl}}}}


def test_each_cpu_takes_the_newest_run_having_each_figure(tmp_path):
    save(tmp_path, "smollm2_20261201-010000.json", "2", smollm2(1.5, 1.1, 2.0))
    save(tmp_path, "smollm2_20261202-010000.json", "2", smollm2(1.3, 1.25, 1.2))
    save(tmp_path, "smollm2_20261203-010000.json", "3", smollm2(1.0, 1.0, 1.0))
    save(tmp_path, "rl_smollm2_20261201-020000.json", "2", rl_smollm2("grpo", 4.0, 10.0))
    save(tmp_path, "rl_smollm2_20261202-020000.json", "2", rl_smollm2("ppo", 6.0, 10.0))  # no GRPO in it
    table = targets.figures(record.runs(str(tmp_path)))
    two = table["Test CPU, family 1 model 2"]
    assert two["training, / transformers"][0] == 1.3 and two["scoring, / transformers"][0] == 1.25
    assert two["GRPO step, SmolLM2, / TRL"][0] == 0.4 and two["PPO step, SmolLM2, / TRL"][0] == 0.6
    assert "GRPO step, SmolLM2, / TRL" not in table["Test CPU, family 1 model 3"]


def test_a_figure_short_of_its_target_says_so_and_rounding_does_not_hide_it():
    train, ppo, peak = targets.TARGETS[1], targets.TARGETS[6], targets.TARGETS[0]
    assert targets.cell(train, (1.25, None)) == "**1.25x**"
    assert targets.cell(train, (1.1, None)) == "**1.10x** (not met)"
    assert targets.cell(train, (1.1996, None)) == "**1.1996x** (not met)"  # 1.20x would read as met
    assert targets.cell(ppo, (0.503, None)) == "**0.503x** (not met)"
    assert targets.cell(ppo, (0.5, None)) == "**0.50x**"
    assert targets.cell(peak, (0.647, None)) == "**64.7%** (not met)" and targets.cell(peak, (0.71, None)) == "**71%**"
    assert targets.cell(peak, None) == "-"
