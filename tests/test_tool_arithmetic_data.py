"""examples/tool_arithmetic/make_data.py: the committed demo data is what the generator writes, the splits share
no question, every operand has 3-5 digits, and each tool trace's answer is the calculator's."""
import filecmp
import importlib.util
import json
import os
import re

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
COMMITTED = os.path.join(ROOT, "data", "tool_arithmetic")


def make_data():
    spec = importlib.util.spec_from_file_location("make_data", os.path.join(ROOT, "examples", "tool_arithmetic",
                                                                            "make_data.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def rows(directory, name):
    with open(os.path.join(directory, f"{name}.jsonl"), encoding="utf-8") as f:
        return [json.loads(line) for line in f]


def test_the_committed_data_is_the_generators_output(tmp_path):
    make_data().main(["--output", str(tmp_path)])  # the defaults made data/tool_arithmetic
    for name in ("sft_tools", "sft_direct", "train", "heldout"):
        assert filecmp.cmp(tmp_path / f"{name}.jsonl", os.path.join(COMMITTED, f"{name}.jsonl"), shallow=False), name


def test_splits_are_disjoint_operands_have_3_to_5_digits_and_answers_are_the_calculators():
    sft = [row["messages"] for row in rows(COMMITTED, "sft_tools")]
    questions = {"sft": [m[1]["content"] for m in sft]}
    questions.update({name: [row["input"] for row in rows(COMMITTED, name)] for name in ("train", "heldout")})
    assert [row["input"] for row in rows(COMMITTED, "sft_direct")] == questions["sft"]
    every = sum(questions.values(), [])
    assert len(set(every)) == len(every) == 900
    assert all(3 <= len(n) <= 5 for q in every for n in re.findall(r"\d+", q))
    for messages in sft:
        assert [m["role"] for m in messages] == ["system", "user", "assistant", "tool", "assistant"]
        assert messages[4]["content"] == f"The answer is {messages[3]['content']}."
    assert any(row["answer"].startswith("-") for row in rows(COMMITTED, "heldout"))  # negative results too
