import pytest

from alignment.rewards.rules import accuracy, extract_answer, format_reward


def test_extract_answer_prefers_the_last_tag_then_the_last_number():
    assert extract_answer("so <answer> 42 </answer>") == "42"
    assert extract_answer("<answer>1</answer> no, <answer>2</answer>") == "2"
    assert extract_answer("5 + 13 = 18") == "18"
    assert extract_answer("the total is 1,250.") == "1250"
    assert extract_answer("no idea") is None


def test_accuracy_compares_numbers_and_text():
    completions = ["<answer>-3</answer>", "82 - 85 = -3.0", "<answer>4</answer>", "", "<answer>Paris</answer>"]
    answers = ["-3", "-3", "5", "1", "Paris"]
    assert accuracy([""] * 5, completions, answer=answers) == [1.0, 1.0, 0.0, 0.0, 1.0]


def test_format_reward_strict_partial_and_none():
    completions = ["<answer>18</answer>", "<think>5+13</think>\n<answer>18</answer>\n", "It is <answer>18</answer>.",
                   "<answer>1</answer><answer>2</answer>", "18", "<think>x</think> text <answer>1</answer>"]
    assert format_reward([""] * 6, completions) == [1.0, 1.0, 0.5, 0.0, 0.0, 0.5]


def test_an_empty_answer_block_is_no_answer():
    """The reward hack GRPO found on SmolLM2: echo the prompt's empty tags, then a number."""
    hack = "The final number inside <answer></answer> is 1."
    assert extract_answer(hack) == "1"  # the last number, as for a completion without tags
    assert extract_answer("<answer> </answer>") is None
    assert format_reward([""] * 4, [hack, "<answer></answer>", "<answer> \n</answer>", "<answer>7</answer>"]) == \
        [0.0, 0.0, 0.0, 1.0]
    assert accuracy([""] * 2, [hack, "<answer></answer> so 5"], answer=["1", "5"]) == [1.0, 1.0]


def test_gsm8k_rule_reward_is_paddlenlps_strict_hash_answer():
    """PaddleNLP's compute_score (method strict, format_score 0, score 1) on hand-written completions."""
    from alignment.rewards.functions import load_reward_function
    from alignment.rewards.rules import gsm8k, gsm8k_answer

    assert load_reward_function("gsm8k") is gsm8k
    assert gsm8k_answer("so 3 + 4 = 7\n#### 7") == "7"
    assert gsm8k_answer("#### 5 then #### -1,250") == "-1250"    # the last one, commas removed
    assert gsm8k_answer("####7") is None and gsm8k_answer("The answer is 7.") is None  # "#### " is required
    completions = ["Natalia sold 48 + 24 = 72 clips.\n#### 72",   # right
                   "#### 1,000",                                  # right: commas go
                   "48 + 24 = 72. The answer is 72.",             # right number, no '#### ': 0 (strict)
                   "#### 71",                                     # wrong number: format_score 0
                   "#### 72.0",                                   # text compare, as PaddleNLP: 0
                   "#### 3 ... on second thought #### 72",        # the last '#### N' counts
                   "#### 72"]                                     # label given as a GSM8K solution
    answers = ["72", "1000", "72", "72", "72", "72", "Natalia sold 24 clips in May... 48+24=72\n#### 72"]
    assert gsm8k([""] * 7, completions, answer=answers) == [1.0, 1.0, 0.0, 0.0, 0.0, 1.0, 1.0]
    with pytest.raises(ValueError, match="'gsm8k' rule reward needs an 'answer' column"):
        gsm8k([""], ["#### 1"])
