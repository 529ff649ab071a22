"""Every shipped argument file (config/**) and every PaddleNLP / PaddleFormers argument file kept as a fixture
(tests/fixtures/paddlenlp, tests/fixtures/paddleformers) runs the algorithm it asks for under its entry point: the
loss type / advantage estimator the run records in its effective arguments (args.json) is the one the file names, never a silent switch (KTO's file trains KTO, not sigmoid
DPO). One KTO step on the tiny model shows KTO's own metric (the KL reference point) in the run's log."""
import glob
import json
import os

import pytest

from alignment.config import paddlenlp
from alignment.config.data import DataArguments, LoRAArguments, ModelArguments
from alignment.config.environment import EnvironmentArguments
from alignment.config.asynchronous import AsyncArguments
from alignment.config.distill import DistillArguments, DistillPPOArguments
from alignment.config.dpo import DPOArguments, KTOArguments
from alignment.config.parser import ArgumentParser, load_argument_file
from alignment.config.ppo import PPOArguments, PPODataArguments, PPOModelArguments
from alignment.config.reward import RewardArguments
from alignment.config.training import TrainingArguments
from tests.helpers import REPO, read_metrics
from tests.data.test_paddlenlp_data import KTO_ROWS, write_jsonl

FILES = sorted(glob.glob(os.path.join(REPO, "config", "**", "*_argument.*"), recursive=True) +
               glob.glob(os.path.join(REPO, "tests", "fixtures", "paddlenlp", "*_argument.*")) +
               glob.glob(os.path.join(REPO, "tests", "fixtures", "paddleformers", "*.yaml")))
SAME = (ModelArguments, DataArguments)
# the entry point of each kind of file (PaddleNLP: llm/alignment/{ppo,rl}/run_*.py, rm, dpo/run_dpo.py,
# kto/run_kto.py; here alignment/<stage>/run_*.py), its argument classes, and the key that names its algorithm
ENTRIES = {
    "sft": (SAME + (LoRAArguments, TrainingArguments), None),
    "rm": (SAME + (RewardArguments, LoRAArguments, TrainingArguments), "loss_type"),
    "dpo": (SAME + (DPOArguments, LoRAArguments, TrainingArguments), "loss_type"),
    "kto": (SAME + (KTOArguments, LoRAArguments, TrainingArguments), "loss_type"),
    "ppo": ((PPOModelArguments, PPODataArguments, PPOArguments, DistillArguments, EnvironmentArguments,
             AsyncArguments, LoRAArguments, TrainingArguments), "advantage_estimator"),
    "distill": ((PPOModelArguments, PPODataArguments, DistillPPOArguments, DistillArguments, EnvironmentArguments,
                 AsyncArguments, LoRAArguments, TrainingArguments), "advantage_estimator"),
}
STAGE_OF = {"grpo": "ppo", "rloo": "ppo", "reinforce": "ppo", "dr": "ppo", "dapo": "ppo", "gspo": "ppo", "vapo": "ppo",
            "prm": "rm", **{stage: stage for stage in ENTRIES}}
DEFAULTS = {"rm": "sequence-wise", "dpo": "sigmoid", "kto": "kto", "ppo": "gae", "distill": "none"}
# what a test run changes in every file (degrees and reward sources this machine has); nothing algorithmic
OVERRIDES = ["--tensor_parallel_degree", "1", "--sharding_parallel_degree", "1", "--sharding", ""]


def stage_of(path):
    """The entry point a file is for, by its name's first word (grpo_tools_argument.json, dpo_full.yaml, ...)."""
    return STAGE_OF[os.path.basename(path).split("_")[0]]


def asked_for(values, stage):
    """The algorithm the file's own text names (PaddleNLP's rl_algorithm through its table), else the default."""
    if stage == "ppo" and "rl_algorithm" in values:
        return paddlenlp.RL_ALGORITHMS[values["rl_algorithm"]]
    return values.get(ENTRIES[stage][1], DEFAULTS[stage])


@pytest.mark.parametrize("path", FILES, ids=lambda p: os.path.relpath(p, REPO))
def test_each_file_runs_the_algorithm_it_names(path):
    stage = stage_of(path)
    classes, key = ENTRIES[stage]
    extra = ["--use_rule_reward", "false", "--reward_model_name_or_path", "rm"] if "use_rule_reward" in \
        load_argument_file(path) else []
    instances = ArgumentParser(*classes).parse_args([path, *OVERRIDES, *extra])
    if key is None:
        return  # SFT has one algorithm
    effective = {k: v for instance in instances for k, v in vars(instance).items()}
    assert effective[key] == asked_for(load_argument_file(path), stage), (path, key)
    if stage == "rm":  # a process reward model's file trains a PRM, a pairwise one's a pairwise reward model
        assert effective["process_reward"] is bool(load_argument_file(path).get("process_reward")), path


def test_every_kind_of_file_is_covered():
    assert {"sft", "rm", "dpo", "kto", "ppo", "distill"} <= {stage_of(path) for path in FILES}
    assert any(path.endswith(os.path.join("paddlenlp", "kto_argument.json")) for path in FILES)


def test_the_kto_file_with_the_dpo_entry_point_is_refused_on_kto_rows(tmp_path, tiny_model_dir, capsys):
    """run_dpo.py with KTO rows (one response each) stops, naming run_kto.py; it does not pair or skip them."""
    from alignment.dpo import run_dpo

    data = write_jsonl(tmp_path / "kto.jsonl", KTO_ROWS)
    with pytest.raises(SystemExit) as info:
        run_dpo.main([os.path.join(REPO, "tests", "fixtures", "paddlenlp", "kto_argument.json"),
                      "--model_name_or_path", tiny_model_dir, "--train_dataset_path", data, "--dev_dataset_path", "",
                      "--output_dir", str(tmp_path / "o"), "--tensor_parallel_degree", "1", "--max_steps", "1"])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert "kto.jsonl' sample 0: no 'other_answer' field" in err and "alignment/dpo/run_kto.py" in err


def test_paddlenlp_kto_file_trains_kto_on_paddlenlp_kto_rows(tmp_path, tiny_model_dir, capsys):
    from alignment.dpo import run_kto

    data = write_jsonl(tmp_path / "kto.jsonl", KTO_ROWS)
    out = tmp_path / "out"
    run_kto.main([os.path.join(REPO, "tests", "fixtures", "paddlenlp", "kto_argument.json"), "--model_name_or_path",
                  tiny_model_dir, "--train_dataset_path", data, "--dev_dataset_path", "", "--output_dir", str(out),
                  "--tensor_parallel_degree", "1", "--max_steps", "1", "--desirable_weight", "1.5"])
    assert "\nkto done" in capsys.readouterr().out
    args = json.load(open(out / "args.json"))
    assert (args["loss_type"], args["desirable_weight"], args["beta"]) == ("kto", 1.5, 0.1)
    (row,) = read_metrics(out)
    # step 1: the policy is the reference, so every log-ratio and KTO's reference point (logged by the KTO loss
    # only) are 0, and each row's loss is its weight x (1 - s(0)): the 8 rows of one step (batch 1 x 8
    # accumulation steps: the 4-row file twice) are half desirable (1.5 x 0.5) and half undesirable (1 x 0.5)
    assert row["kl"] == 0.0 and row["rewards/margin"] == 0.0
    assert row["loss"] == pytest.approx((4 * 1.5 * 0.5 + 4 * 1.0 * 0.5) / 8, rel=1e-6)
    assert os.path.isdir(out / "model")


@pytest.mark.parametrize("loss_type", ["sigmoid", "kto_pair"])
def test_the_kto_entry_point_refuses_another_loss_type_before_anything_is_written(tmp_path, tiny_model_dir, capsys,
                                                                                   loss_type):
    from alignment.dpo import run_kto

    data = write_jsonl(tmp_path / "kto.jsonl", KTO_ROWS)
    with pytest.raises(SystemExit) as info:
        run_kto.main([os.path.join(REPO, "tests", "fixtures", "paddlenlp", "kto_argument.json"),
                      "--model_name_or_path", tiny_model_dir, "--train_dataset_path", data, "--dev_dataset_path", "",
                      "--output_dir", str(tmp_path / "out"), "--tensor_parallel_degree", "1", "--loss_type",
                      loss_type])
    err = capsys.readouterr().err.strip()
    assert info.value.code == 2 and len(err.splitlines()) == 1
    assert f"key 'loss_type': run_kto.py trains KTO, not '{loss_type}'" in err and "run_dpo.py" in err
    assert not (tmp_path / "out").exists()
