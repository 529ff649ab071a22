"""Gold judges (alignment/rewards/judges.py) and judge-labelled preference data (tools/make_preference_data.py)."""
import json
import os
from pathlib import Path

import pytest

from alignment.rewards import judges as J
from alignment.data import RawDataset
from alignment.commands import make_preference_data as mpd

REPO = Path(__file__).resolve().parents[2]
DATA = REPO / "data"


pytestmark = pytest.mark.usefixtures("offline_datasets")


def one(judge, prompt, completion, **labels):
    return J.get_judge(judge)([prompt], [completion], **{k: [v] for k, v in labels.items()})[0]


# --------------------------------------------------------------------------- registry


def test_registry_and_unknown_name():
    assert set(J.JUDGES) >= {"sentiment", "arithmetic", "combined", "reasoning_gym"}
    assert J.get_judge("sentiment") is J.sentiment
    with pytest.raises(ValueError, match="Unknown judge 'vibes'.*arithmetic.*sentiment"):
        J.get_judge("vibes")


def test_lengths_must_match():
    with pytest.raises(ValueError, match="2 prompts but 1 completions"):
        J.sentiment(["a", "b"], ["x"])
    with pytest.raises(ValueError, match="label 'answer' has 1 values for 2 prompts"):
        J.arithmetic(["What is 1 + 1?"] * 2, ["2", "2"], answer=[2])


# --------------------------------------------------------------------------- sentiment


def test_sentiment_orders_warm_above_curt_above_negative():
    warm = "That is great news! Well done, and thank you for sharing it with me."
    curt = "Okay."
    negative = "That is terrible and you should feel bad about it."
    scores = J.sentiment([""] * 3, [warm, curt, negative])
    assert scores[0] > 0.7 > scores[1] and scores[1] > scores[2]
    assert all(-1.0 <= s <= 1.0 for s in scores)


def test_sentiment_penalises_short_empty_and_repetition():
    assert one("sentiment", "", "") == -1.0 and one("sentiment", "", "   ") == -1.0
    assert one("sentiment", "", "Congratulations!") < one("sentiment", "", "Congratulations, that is wonderful!")
    spam = "great great great great great great"
    assert J.degeneracy(spam) == 1.0 and one("sentiment", "", spam) == -1.0
    loop = "I am happy. I am happy. I am happy. I am happy."
    assert J.degeneracy(loop) > 0.5 and one("sentiment", "", loop) < 0
    natural = "That's wonderful news, well done! I'm so happy for you."
    assert J.degeneracy(natural) == 0.0
    assert one("sentiment", "", natural) > one("sentiment", "", natural + " " + " ".join(["wonderful"] * 8))


# --------------------------------------------------------------------------- arithmetic


@pytest.mark.parametrize("completion, expected", [
    ("13 + 15 = 28.", 1.1),                   # correct, with a true equation: format credit
    ("The answer is 28", 1.0),                # correct, no equation
    ("13+15=28", 1.1),
    ("13 + 15 = 27.", 0.0),                   # wrong: no credit for the format
    ("I think it is 28, no wait, 27.", 0.0),  # the final number counts
    ("I have no idea.", 0.0),                 # no number
    ("", 0.0),
])
def test_arithmetic_from_the_prompt(completion, expected):
    assert one("arithmetic", "What is 13 + 15?", completion) == pytest.approx(expected)


def test_arithmetic_operators_and_numbers():
    assert one("arithmetic", "What is 19 - 8?", "19-8 is 11") == 1.0
    assert one("arithmetic", "What is 7 x 12?", "7 x 12 = 84.") == pytest.approx(1.1)
    assert one("arithmetic", "What is 3 - 5?", "It is -2.") == 1.0
    assert one("arithmetic", "What is 50 x 40?", "That makes 2,000.") == 1.0
    assert one("arithmetic", "What is 7 / 2?", "3.5") == 1.0
    assert J.final_number("SmolLM2 says 2.5.") == 2.5 and J.final_number("no digits") is None


def test_word_problems_with_and_without_label():
    prompt = ("Solve this word problem. Answer in one sentence.\n\n"
              "Ravi buys 2 bags with 18 stamps in each bag. How many stamps is that in total?")
    assert J.expected_from_prompt(prompt) == 36
    assert one("arithmetic", prompt, "2 x 18 = 36. That is 36 stamps in total.") == pytest.approx(1.1)
    assert one("arithmetic", prompt, "That is 38 stamps.") == 0.0
    # a label wins over the prompt: a number, or reference text whose last number is the answer
    assert one("arithmetic", prompt, "That is 36 stamps.", answer="2 x 18 = 36.") == 1.0
    assert one("arithmetic", prompt, "That is 36 stamps.", answer=40) == 0.0
    assert one("arithmetic", "How many legs do 3 cats have?", "12 legs.", answer="12") == 1.0
    assert J.expected_from_prompt("Sam has 16 cookies and gets 4 more. How many cookies does Sam have now?") == 20
    assert J.expected_from_prompt("Lena has 23 apples and gives 5 away. How many apples are left?") == 18
    assert J.expected_from_prompt("Share one short, practical tip for sleeping well.") is None


def test_routing_and_combined():
    word = "Solve this word problem. Answer in one sentence.\n\nTom has 3 marbles and gets 2 more. How many?"
    cheer = "Write a short cheerful reply to this message.\n\nHi! I cooked dinner for my family!"
    tip = "What is one good tip for sleeping well?"
    assert J.route(["What is 7 x 12?", word, cheer, tip]) == ["arithmetic", "arithmetic", "sentiment", "sentiment"]
    assert J.judge_for_prompt("How many legs do 3 cats have?", answer="12") == "arithmetic"
    assert J.judge_for_prompt(tip, answer="Go to bed at the same time every night.") == "sentiment"
    scores = J.combined(["What is 7 x 12?", cheer], ["7 x 12 = 84.", "How lovely, well done!"])
    assert scores[0] == pytest.approx(1.1) and scores[1] == pytest.approx(J.sentiment([cheer], ["How lovely, well done!"])[0])


def test_combined_agrees_with_the_shipped_preference_labels():
    """On the demo pairs the gold judge prefers the labelled-better side for arithmetic, word problems,
    cheerful replies and positive rewrites (tips and safety are out of its reach: see the docstring)."""
    checked = 0
    for name in ("train", "test"):
        for sample in RawDataset.load(f"PKU-SafeRLHF/{name}", path=DATA / "preference"):
            prompt = sample["input"]
            if not prompt.startswith(("What is ", "Solve this", "Write a short cheerful", "Rewrite the")):
                continue
            if prompt.startswith("What is one"):
                continue  # tips
            better, worse = (sample["answer"], sample["other_answer"])[:: 1 if sample["better"] else -1]
            scores = J.combined([prompt, prompt], [better, worse])
            assert scores[0] > scores[1], (prompt, better, worse, scores)
            checked += 1
    assert checked > 300


def test_reasoning_gym_wrapper():
    reasoning_gym = pytest.importorskip("reasoning_gym")
    data = reasoning_gym.create_dataset("chain_sum", size=3, seed=7)
    entries = list(data)
    prompts = [e["question"] for e in entries]
    right = [f"<answer>{e['answer']}</answer>" for e in entries]
    wrong = [str(int(e["answer"]) + 1) for e in entries]
    labels = dict(answer=[e["answer"] for e in entries], metadata=[e["metadata"] for e in entries])
    assert J.reasoning_gym_accuracy(prompts, right, **labels) == [1.0] * 3
    assert J.reasoning_gym_accuracy(prompts, wrong, **labels) == [0.0] * 3
    with pytest.raises(ValueError, match="needs the 'answer' and 'metadata'"):
        J.reasoning_gym_accuracy(prompts, right)


# --------------------------------------------------------------------------- preference-pair building


def test_drop_reasons():
    assert mpd.drop_reason("a b", "c d", 0.5, 0.2, 0.05) is None
    assert mpd.drop_reason("", "c d", 0.5, 0.2, 0.05) == "empty"
    assert mpd.drop_reason(" same ", "same", 0.5, 0.2, 0.05) == "identical"
    assert mpd.drop_reason("a", "b", 0.50, 0.47, 0.05) == "margin"
    assert mpd.drop_reason("a", "b", 0.3, 0.3, 0.0) == "margin"  # a tie has no better side


def stub_judge(prompts, completions, **labels):
    """Score = the number written in the completion, or 0."""
    return [float(J.final_number(c) or 0) for c in completions]


def test_pairs_from_a_stub_scorer():
    prompts = ["p1", "p2", "p3"]
    samples = [["one 1", "three 3", "two 2", "two 2"],  # pair 1 kept (1 better), pair 2 identical
               ["five 5", "four 4.98", "x", ""],          # pair 1 margin 0.02, pair 2 empty
               ["nine 9", "zero 0", "six 6", "seven 7"]]  # both kept
    scores, judges = mpd.score_samples("sentiment", prompts, samples, judge_fn=stub_judge)
    assert scores[0] == [1.0, 3.0, 2.0, 2.0] and judges == ["sentiment"] * 3
    rows, stats = mpd.make_rows(prompts, samples, scores, judges, min_margin=0.05)
    assert stats.candidates == 6 and stats.kept == 3
    assert stats.dropped == {"empty": 1, "identical": 1, "margin": 1} and stats.kept_by_judge == {"sentiment": 3}
    assert [(r["prompt"], r["better_response_id"]) for r in rows] == [("p1", 1), ("p3", 0), ("p3", 1)]
    first = rows[0]
    assert first == {"prompt": "p1", "response_0": "one 1", "response_1": "three 3", "better_response_id": 1,
                     "safer_response_id": 1, "is_response_0_safe": True, "is_response_1_safe": True,
                     "score_0": 1.0, "score_1": 3.0, "judge": "sentiment"}
    with pytest.raises(ValueError, match="even number"):
        mpd.build_pairs("p", ["a", "b", "c"], [1, 2, 3], "x", 0.0)


def test_combined_records_the_routed_judge_and_passes_labels():
    prompts = ["What is 2 + 2?", "Say something nice.", "How many legs do 3 cats have?"]
    samples = [["2 + 2 = 4.", "5"], ["You are wonderful!", "No."], ["12", "11"]]
    scores, judges = mpd.score_samples("combined", prompts, samples, answers=[None, None, "12"])
    assert judges == ["arithmetic", "sentiment", "arithmetic"]
    assert scores[0] == pytest.approx([1.1, 0.0]) and scores[2] == [1.0, 0.0]
    assert scores[1][0] > scores[1][1]


def test_batch_plan_keeps_copies_together_and_sorts_by_length():
    plan = mpd.batch_plan([5, 2, 9], copies=2, batch_size=4)
    assert plan == [[1, 1, 0, 0], [2, 2]]


def test_written_rows_load_as_pku_saferlhf(tmp_path):
    rows = [mpd.pair_row("What is 2 + 2?", "4", "5", 1.0, 0.0, "arithmetic"),
            mpd.pair_row("Say hi.", "Hi!", "Hello there, lovely to see you!", 0.2, 0.9, "sentiment")]
    mpd.write_jsonl_atomic(str(tmp_path / "test.jsonl"), rows)
    assert [p.name for p in tmp_path.iterdir()] == ["test.jsonl"]  # no temporary file left behind
    umask = os.umask(0)
    os.umask(umask)
    assert (tmp_path / "test.jsonl").stat().st_mode & 0o777 == 0o666 & ~umask
    loaded = list(RawDataset.load("PKU-SafeRLHF/test", path=tmp_path))  # a directory loads <split>.jsonl
    assert [s["better"] for s in loaded] == [True, False] and loaded[1]["other_answer"].startswith("Hello")


def test_tool_end_to_end_on_the_tiny_model(tmp_path, tiny_model_dir, capsys):
    output = tmp_path / "judged" / "train.jsonl"
    summary = mpd.main(["--model", tiny_model_dir, "--prompts", str(DATA / "prompts" / "train.jsonl"),
                        "--output", str(output), "--num-prompts", "4", "--pairs-per-prompt", "2",
                        "--max-new-tokens", "8", "--seed", "1", "--no-progress"])
    printed = capsys.readouterr().out
    assert "kept" in printed and "loads as PKU-SafeRLHF" in printed
    rows = [json.loads(line) for line in output.read_text().splitlines()]
    loaded = RawDataset.load("PKU-SafeRLHF/train", path=output.parent)
    assert len(loaded) == len(rows) == summary["kept_pairs"] >= 1
    assert summary["candidate_pairs"] == 8 and summary["samples"] == 16
    for row, sample in zip(rows, loaded):
        assert abs(row["score_0"] - row["score_1"]) >= 0.05 and row["judge"] in ("arithmetic", "sentiment")
        assert sample["better"] == (row["score_0"] > row["score_1"]) and sample["safer"] == sample["better"]
    again = mpd.main(["--model", tiny_model_dir, "--prompts", str(DATA / "prompts" / "train.jsonl"),
                      "--output", str(tmp_path / "again.jsonl"), "--num-prompts", "4", "--pairs-per-prompt", "2",
                      "--max-new-tokens", "8", "--seed", "1", "--no-progress"])
    assert (tmp_path / "again.jsonl").read_text() == output.read_text()  # deterministic for a seed
    assert again["kept_pairs"] == summary["kept_pairs"]
