"""examples/tool_arithmetic/make_data.py: the committed demo data is what the generator writes, the splits share
no question, every operand has 3-5 digits, and every answer (the RL sets', the tool traces' calculator output and final
sentence, the direct arm's) is the arithmetic of its question, read here from the question's words."""
import filecmp
import importlib.util
import json
import operator
import os
import re

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
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


# each question shape the generator writes, read independently of it: (pattern, the arithmetic of its numbers)
MUL = operator.mul
READINGS = [
    (r"What is (\d+) \* (\d+)\?", MUL), (r"Compute (\d+) \* (\d+)\.", MUL), (r"Calculate (\d+) times (\d+)\.", MUL),
    (r"What is (\d+) \* (\d+) \+ (\d+)\?", lambda a, b, c: a * b + c),
    (r"Compute (\d+) \+ (\d+) \* (\d+)\.", lambda c, a, b: c + a * b),
    (r"What is \((\d+) \+ (\d+)\) \* (\d+)\?", lambda a, b, c: (a + b) * c),
    (r"Calculate (\d+) \+ (\d+) - (\d+)\.", lambda a, b, c: a + b - c),
    (r"A warehouse has (\d+) boxes with (\d+) screws in each box\. How many screws are there\?", MUL),
    (r"Sara had (\d+) coins\. She earned (\d+) more and then spent (\d+)\. How many coins does she have now\?",
     lambda a, b, c: a + b - c),
    (r"A school buys (\d+) packs of (\d+) pencils and (\d+) loose pencils\. How many pencils is that\?",
     lambda a, b, c: a * b + c),
]


def worked_out(question):
    """The integer answer of a question, from the one reading that matches it whole."""
    found = [(fn, match) for pattern, fn in READINGS for match in [re.fullmatch(pattern, question)] if match]
    assert len(found) == 1, question
    fn, match = found[0]
    return str(fn(*(int(n) for n in match.groups())))


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
        answer = worked_out(messages[1]["content"])
        assert messages[3]["content"] == answer and messages[4]["content"] == f"The answer is {answer}."
    for row in rows(COMMITTED, "sft_direct"):
        assert row["answer"] == f"The answer is {worked_out(row['input'])}."
    for name in ("train", "heldout"):
        assert all(row["answer"] == worked_out(row["input"]) for row in rows(COMMITTED, name)), name
    assert any(row["answer"].startswith("-") for row in rows(COMMITTED, "heldout"))  # negative results too
