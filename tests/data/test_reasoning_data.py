"""The reasoning demo's data: worked solutions of chain sums, disjoint seed ranges per split, and held-out rows
that skip every question of the files a demo trains on."""
import json

import pytest

from alignment.commands.make_reasoning_data import main, make_rows, worked_solution
from alignment.evaluation.tasks import ReasoningGymTask, reasoning_rows
from alignment.inputs import InputError


def test_a_worked_solution_computes_left_to_right_through_negative_partial_sums():
    assert worked_solution("State the final answer to the following arithmetic problem: 6 - 2 + 5 =") == \
        "6 - 2 = 4\n4 + 5 = 9\n<answer>9</answer>"
    assert worked_solution("... problem: 1 - 8 + 3 =") == "1 - 8 = -7\n-7 + 3 = -4\n<answer>-4</answer>"
    assert worked_solution("... problem: 0 - 9 - 8 =") == "0 - 9 = -9\n-9 - 8 = -17\n<answer>-17</answer>"
    assert worked_solution("problem: 7 + 5 =") == "7 + 5 = 12\n<answer>12</answer>"
    with pytest.raises(ValueError, match="not a chain sum"):
        worked_solution("What is 3 times 4?")


def read(path):
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f]


def test_splits_take_consecutive_seed_ranges_and_a_zero_split_is_not_written(tmp_path):
    # reasoning-gym draws item i of seed s from s + i: eval at seed + 1 would repeat train[1:] (the old bug)
    (tmp_path / "chain_sum_train.jsonl").write_text("kept\n")
    main(["--task", "chain_sum", "--train", "0", "--eval", "4", "--worked", "3", "--seed", "100",
          "--output-dir", str(tmp_path)])
    assert (tmp_path / "chain_sum_train.jsonl").read_text() == "kept\n"
    assert read(tmp_path / "chain_sum_eval.jsonl") == make_rows("chain_sum", 4, 100)
    worked = read(tmp_path / "chain_sum_worked.jsonl")
    later = make_rows("chain_sum", 3, 104)
    assert [row["instruction"] for row in worked] == [row["prompt"] for row in later]
    assert [row["output"].rsplit("<answer>", 1)[1] for row in worked] == [f"{r['answer']}</answer>" for r in later]
    assert all(row["input"] == "" for row in worked)


def test_worked_solutions_exist_for_chain_sums_only(tmp_path):
    with pytest.raises(InputError, match="--worked"):
        main(["--task", "basic_arithmetic", "--worked", "2", "--output-dir", str(tmp_path)])
    assert list(tmp_path.iterdir()) == []


def test_held_out_rows_skip_training_questions_and_keep_their_size(tmp_path):
    options = dict(min_terms=2, max_terms=2, min_digits=1, max_digits=1)
    drawn = reasoning_rows("chain_sum", 12, 7, options)
    train = tmp_path / "train.jsonl"
    train.write_text("".join(json.dumps({"prompt": row["input"], "answer": row["answer"]}) + "\n"
                             for row in drawn[:3]) + json.dumps({"instruction": drawn[5]["input"]}) + "\n")

    class Held(ReasoningGymTask):  # no NAME: not registered
        dataset, size, seed = "chain_sum", 6, 7
        exclude_files = (str(train),)

    Held.options = options
    rows = Held().rows()
    seen = {row["input"] for row in drawn[:3]} | {drawn[5]["input"]}
    expected = [row for row in drawn if row["input"] not in seen]
    assert rows == expected[:6] and len(rows) == 6  # 12 drawn (seeds 7..18), 4 or more skipped, 6 kept
