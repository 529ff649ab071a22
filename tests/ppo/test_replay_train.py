"""tools/replay_ledger.py --train: a step's update replayed from the rollout ledger and the checkpoint before it
equals the run's own step, bit for bit; bad input is one line, exit 2, nothing written."""
import json
import os
import shutil

import numpy as np
import pytest
from safetensors.numpy import load_file

from alignment.commands import replay_ledger
from alignment.exits import run_program
from alignment.ppo import run_ppo
from tests.helpers import REPO, read_metrics

PROMPTS = f"prompt-only:1.0:{REPO}/data/prompts/train.jsonl"


def tiny_run(out, config, actor, *extra):
    """Two steps, a checkpoint after step 1, the ledger kept, every step logged alone."""
    run_ppo.main([os.path.join(REPO, "config", "tiny", config), "--actor_model_name_or_path", actor,
                  "--output_dir", str(out), "--disable_tqdm", "--train_datasets", PROMPTS, "--eval_datasets", "",
                  "--max_steps", "2", "--save_steps", "1", "--logging_steps", "1", "--max_new_tokens", "8",
                  "--rollout_ledger", "true", "--report_to", "", *extra])
    return out


@pytest.fixture(scope="module")
def grpo_run(tiny_model_dir, tmp_path_factory):
    return tiny_run(tmp_path_factory.mktemp("grpo") / "run", "grpo_argument.json", tiny_model_dir,
                    "--per_device_prompt_batch_size", "2", "--num_return_sequences", "2",
                    "--per_device_train_batch_size", "4")


def replay(run, step, out, *extra):
    return replay_ledger.main([str(run), "--train", "--step", str(step), "--output", str(out), *extra])


def weights(folder, name="policy"):
    return load_file(os.path.join(folder, name, "model.safetensors"))


def assert_bitwise_equal(a, b):
    assert a.keys() == b.keys()
    for key in a:
        assert np.array_equal(a[key], b[key]), key


def assert_metrics_as_logged(out, run, step):
    replayed = json.load(open(os.path.join(out, "replay.json")))["metrics"]
    logged = read_metrics(run)[step - 1]
    assert {"actor_loss", "kl", "entropy", "advantage/mean", "clip_frac", "lr", "response_length"} <= set(replayed)
    assert {key: logged[key] for key in replayed} == replayed


def test_grpo_steps_replayed_from_the_ledger_equal_the_run_bit_for_bit(grpo_run, tmp_path, capsys):
    # step 1 from the run's start (the trainer built afresh), step 2 from checkpoint-1
    assert replay(grpo_run, 1, tmp_path / "one") == 0
    assert replay(grpo_run, 2, tmp_path / "two") == 0
    assert_bitwise_equal(weights(tmp_path / "one"), weights(grpo_run / "checkpoint-1"))
    assert_bitwise_equal(weights(tmp_path / "two"), weights(grpo_run))  # the run's last step: its final policy
    before, after = weights(grpo_run / "checkpoint-1"), weights(tmp_path / "two")
    assert any(not np.array_equal(before[k], after[k]) for k in before)  # the step did move the weights
    assert_metrics_as_logged(tmp_path / "one", grpo_run, 1)
    assert_metrics_as_logged(tmp_path / "two", grpo_run, 2)
    assert "policy: sha256" in capsys.readouterr().out


def test_a_reward_changed_in_the_ledger_changes_the_replayed_update(grpo_run, tmp_path, capsys):
    run = tmp_path / "run"
    shutil.copytree(grpo_run, run)
    path = run / "ledger" / "steps-000001.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    step_two = [row for row in rows if row["step"] == 2]
    step_two[0]["reward"] += 1.0  # the group's advantages change
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    assert replay(run, 2, tmp_path / "out") == 1
    assert "tensors differ from the run's" in capsys.readouterr().out
    differing = json.load(open(tmp_path / "out" / "replay.json"))["weights"]["policy"]["differing_tensors"]
    assert differing


def test_ppo_with_a_critic_and_normalised_rewards_replays_bit_for_bit(tiny_model_dir, tiny_reward_dir, tmp_path):
    # two update passes (old log-probs and values from the checkpoint's weights), the ledger's rewards normalised
    run = tiny_run(tmp_path / "run", "ppo_argument.json", tiny_model_dir, "--reward_model_name_or_path",
                   tiny_reward_dir, "--per_device_prompt_batch_size", "4", "--per_device_train_batch_size", "2")
    assert replay(run, 2, tmp_path / "out") == 0
    for name in ("policy", "value"):
        assert_bitwise_equal(weights(tmp_path / "out", name), weights(run, name))
    assert_metrics_as_logged(tmp_path / "out", run, 2)
    assert "critic_loss" in json.load(open(tmp_path / "out" / "replay.json"))["metrics"]


def bad(run, step, out, capsys, *extra):
    code = run_program(lambda: replay(run, step, out, *extra))
    err = capsys.readouterr().err
    assert code == 2 and not os.path.exists(out), err
    assert len(err.strip().splitlines()) == 1 and err.startswith("error: ")
    return err


def edited_run(grpo_run, tmp_path, edit):
    run = tmp_path / "run"
    shutil.copytree(grpo_run, run)
    edit(run)
    return run


def test_bad_input_is_one_line_exit_2_and_writes_nothing(grpo_run, tmp_path, capsys):
    out = tmp_path / "out"
    assert "no trained samples of step 3 (it holds steps 1-2)" in bad(grpo_run, 3, out, capsys)
    no_ledger = edited_run(grpo_run, tmp_path / "a", lambda run: shutil.rmtree(run / "ledger"))
    assert "ledger: no ledger" in bad(no_ledger, 2, out, capsys)
    no_checkpoint = edited_run(grpo_run, tmp_path / "b", lambda run: shutil.rmtree(run / "checkpoint-1"))
    assert "checkpoint-1/trainer_state.json: no checkpoint of step 1" in bad(no_checkpoint, 2, out, capsys)
    assert "key 'global_step' is 1, not 0" in bad(grpo_run, 1, out, capsys, "--checkpoint",
                                                   str(grpo_run / "checkpoint-1"))
    assert "policy/trainer_state.json: no checkpoint of step 1" in bad(grpo_run, 2, out, capsys, "--checkpoint",
                                                                       str(grpo_run / "policy"))

    def old_format(run):
        path = run / "ledger" / "steps-000001.jsonl"
        rows = [json.loads(line) for line in path.read_text().splitlines()]
        path.write_text("".join(json.dumps({k: v for k, v in row.items() if k != "prompt_ids"}) + "\n"
                                for row in rows))
    old = edited_run(grpo_run, tmp_path / "c", old_format)
    assert "steps-000001.jsonl: step 2's rows have no 'prompt_ids'" in bad(old, 2, out, capsys)

    def asynchronous(run):
        values = json.load(open(run / "args.json"))
        (run / "args.json").write_text(json.dumps({**values, "rollout_ranks": 1}))
    refused = edited_run(grpo_run, tmp_path / "d", asynchronous)
    assert "key 'rollout_ranks' is 1; the replay does not cover asynchronous runs" in bad(refused, 2, out, capsys)

    def moved_model(run):  # found only once the trainer is being built: what it wrote by then is removed
        values = json.load(open(run / "args.json"))
        (run / "args.json").write_text(json.dumps({**values, "actor_model_name_or_path": str(tmp_path / "gone")}))
    assert "gone" in bad(edited_run(grpo_run, tmp_path / "e", moved_model), 2, out, capsys)
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("")
    assert "give a new or empty directory" in replay_error(grpo_run, tmp_path / "full", capsys)


def replay_error(run, out, capsys):
    assert run_program(lambda: replay(run, 2, out)) == 2
    assert sorted(os.listdir(out)) == ["x"]
    return capsys.readouterr().err
