"""The evaluation harness on the tiny model: fixed seeds give the same bits, a killed run resumed equals an
uninterrupted one, a batch's neighbours do not change a sample, training's inline evaluation equals alignment-eval
on the saved policy, a user's task registers, and --compare pairs items."""
import json
import os
import shutil

import pytest

from alignment.commands import evaluate as cli
from alignment.evaluation.policies import LocalPolicy
from alignment.evaluation.runner import ITEMS, EvalSettings, evaluate
from alignment.evaluation.tasks import make_task
from tests.helpers import REPO

TASK_MODULE = '''
from alignment.evaluation import EvalTask

class Sums(EvalTask):
    NAME = "test_sums"
    max_new_tokens = 6
    def rows(self):
        return [{"input": f"What is {a} + {b}?", "answer": str(a + b)} for a in range(3) for b in range(3)]
'''


def items(out):
    with open(os.path.join(out, ITEMS)) as f:
        return [json.loads(line) for line in f]


@pytest.fixture(scope="module")
def task_module(tmp_path_factory):
    """One file for the module's tests: a task NAME registers from one file per process."""
    module = tmp_path_factory.mktemp("tasks") / "my_tasks.py"
    module.write_text(TASK_MODULE)
    return module


@pytest.fixture(scope="module")
def policy(tiny_model_dir):
    return LocalPolicy(tiny_model_dir)


def test_fixed_seed_same_bits_and_batches_do_not_change_samples(policy):
    task = make_task("chain_sum")
    run = lambda batch, seed=0: evaluate(policy, task, EvalSettings(n=3, seed=seed, batch_size=batch, limit=5,
                                                                    max_new_tokens=8))["items"]  # noqa: E731
    first = run(6)
    assert first == run(6)
    assert first == run(3)  # one item per batch instead of two: each sample has its own seed
    other = run(6, seed=1)
    assert [s["completion"] for r in first for s in r["samples"]] != [s["completion"] for r in other
                                                                       for s in r["samples"]]
    assert all(len(r["samples"]) == 3 and r["samples"][1]["seed"] == [0, r["index"], 1] for r in first)


def test_episode_task_plays_the_environment_and_batches_do_not_change_episodes(policy):
    task = make_task("tool_arithmetic")
    run = lambda batch: evaluate(policy, task, EvalSettings(n=2, seed=3, batch_size=batch, limit=3))  # noqa: E731
    first = run(6)
    assert first["items"] == run(2)["items"]
    assert all("environment" in s["rewards"] and s["tokens"] <= task.max_episode_tokens
               for r in first["items"] for s in r["samples"])


def test_killed_run_resumes_to_the_uninterrupted_result(policy, tmp_path):
    task, settings = make_task("basic_arithmetic"), EvalSettings(n=2, seed=4, batch_size=4, limit=7,
                                                                 max_new_tokens=8)
    whole = evaluate(policy, task, settings, str(tmp_path / "whole"))

    class Killed(Exception):
        pass

    def kill_after_two(done, total):
        if done >= 4:
            raise Killed
    with pytest.raises(Killed):
        evaluate(policy, task, settings, str(tmp_path / "cut"), progress=kill_after_two)
    assert len(items(tmp_path / "cut")) == 4
    with open(tmp_path / "cut" / ITEMS, "a") as f:
        f.write('{"index": 4, "prompt": "cut mid-')  # a batch cut mid-write is evaluated again
    resumed = evaluate(policy, task, settings, str(tmp_path / "cut"))
    assert resumed["items"] == whole["items"] and resumed["summary"] == whole["summary"]
    assert items(tmp_path / "cut") == items(tmp_path / "whole")


def test_resume_refuses_other_settings(policy, tmp_path):
    task = make_task("basic_arithmetic")
    evaluate(policy, task, EvalSettings(limit=2, max_new_tokens=4), str(tmp_path))
    with pytest.raises(ValueError, match="seed = 0, not 1"):
        evaluate(policy, task, EvalSettings(limit=2, max_new_tokens=4, seed=1), str(tmp_path))


def test_inline_evaluation_equals_standalone_on_the_saved_policy(tiny_model_dir, task_module, tmp_path):
    from alignment.ppo import run_ppo

    out, module = tmp_path / "grpo", task_module
    run_ppo.main([os.path.join(REPO, "config", "tiny", "grpo_argument.json"), "--actor_model_name_or_path",
                  tiny_model_dir, "--output_dir", str(out), "--max_steps", "1", "--eval_datasets", "",
                  "--gold_judge", "", "--eval_tasks", "chain_sum,test_sums", "--user_eval_modules", str(module),
                  "--eval_k", "2", "--eval_limit", "3", "--eval_temperature", "0.7", "--eval_batch_size", "4",
                  "--disable_tqdm", "true"])
    logged = [json.loads(line) for line in open(out / "metrics.jsonl")]
    assert [row["step"] for row in logged if "eval/test_sums/pass@2" in row] == [0, 1]  # at the start and the end
    assert any("eval/chain_sum/maj@2" in row for row in logged)
    cli.main(["--model", str(out / "policy"), "--task", "chain_sum", "--task", "test_sums", "--task-module",
              str(module), "--n", "2", "--seed", "42", "--limit", "3", "--temperature", "0.7", "--batch-size", "4",
              "--output-dir", str(tmp_path / "alone")])
    for task in ("chain_sum", "test_sums"):
        assert items(out / "eval_tasks" / "step-1" / task) == items(tmp_path / "alone" / task)


def test_user_task_module_and_compare(tiny_model_dir, task_module, tmp_path, capsys):
    module = task_module
    for name, seed in (("a", "0"), ("b", "1")):
        cli.main(["--model", tiny_model_dir, "--task-module", str(module), "--task", "test_sums", "--n", "2",
                  "--seed", seed, "--output-dir", str(tmp_path / name)])
    assert len(items(tmp_path / "a" / "test_sums")) == 9
    summary = json.load(open(tmp_path / "a" / "test_sums" / "summary.json"))
    assert summary["machine"]["model"] and summary["commit"] and summary["summary"]["pass@2"]["low"] <= \
        summary["summary"]["pass@2"]["mean"] <= summary["summary"]["pass@2"]["high"]
    result = cli.main(["--compare", str(tmp_path / "a" / "test_sums"), str(tmp_path / "b" / "test_sums")])
    a, b = items(tmp_path / "a" / "test_sums"), items(tmp_path / "b" / "test_sums")
    expected = sum(y["metrics"]["pass@1"] - x["metrics"]["pass@1"] for x, y in zip(a, b)) / 9
    assert result["items"] == 9 and result["difference"]["pass@1"]["mean"] == pytest.approx(expected)
    shutil.copytree(tmp_path / "a" / "test_sums", tmp_path / "other")
    settings = json.load(open(tmp_path / "other" / "run.json"))
    json.dump({**settings, "rows_sha256": "0"}, open(tmp_path / "other" / "run.json", "w"))
    with pytest.raises(ValueError, match="different items"):
        cli.main(["--compare", str(tmp_path / "a" / "test_sums"), str(tmp_path / "other")])


def test_dataset_task_scores_with_the_named_reward_functions(tiny_model_dir, tmp_path):
    data = tmp_path / "rows.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"Say {i}", "answer": str(i)}) + "\n" for i in range(4)))
    got = cli.main(["--model", tiny_model_dir, "--dataset", f"prompt-only:1.0:{data}", "--reward-funcs",
                    "accuracy,format_reward", "--max-new-tokens", "4", "--output-dir", str(tmp_path / "out")])
    (name,) = got
    records = items(tmp_path / "out" / os.listdir(tmp_path / "out")[0])
    assert [r["label"] for r in records] == ["0", "1", "2", "3"]
    assert all(set(s["rewards"]) == {"accuracy", "format_reward"} and
               s["reward"] == s["rewards"]["accuracy"] + s["rewards"]["format_reward"]
               for r in records for s in r["samples"])


def test_unknown_eval_task_stops_a_training_run_before_any_model_loads(tiny_model_dir, tmp_path, capsys):
    from alignment.exits import run_program
    from alignment.ppo import run_ppo

    argv = [os.path.join(REPO, "config", "tiny", "grpo_argument.json"), "--actor_model_name_or_path", tiny_model_dir,
            "--output_dir", str(tmp_path / "out"), "--eval_tasks", "chain_sum,no_such_task"]
    code = run_program(lambda: run_ppo.main(argv), uses_paddle=False)
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "key 'eval_tasks'" in err[0] and "no_such_task" in err[0], err
    assert not (tmp_path / "out").exists()


def test_a_task_row_without_input_stops_in_one_line_naming_the_task_and_row(policy, tmp_path, capsys):
    from alignment.evaluation import EvalTask
    from alignment.exits import run_program

    class Unasked(EvalTask):  # no NAME in its body: not registered
        def rows(self):
            return [{"input": "What is 1 + 1?", "answer": "2"}, {"question": "What is 2 + 2?", "answer": "4"}]

    Unasked.NAME = "unasked"  # set after the class body: read by the messages, never registered
    out = tmp_path / "out"
    code = run_program(lambda: evaluate(policy, Unasked(), EvalSettings(n=1), str(out)), uses_paddle=False)
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "task 'unasked' row 1: no 'input'" in err[0] and "question" in err[0], err
    assert not out.exists()
