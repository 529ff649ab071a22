"""Tokenized datasets and collators on the tiny tokenizer (ChatML template) with hand-checked expectations."""
import json
import re

import numpy as np
import pytest

from alignment.data.tokenized import (IGNORE_INDEX, PreferenceDataset, PromptOnlyDataset, SupervisedDataset,
                                      collate_preference, collate_prompts, collate_supervised, format_prompt)
from alignment.models import Tokenizer
from alignment.models.tokenizer import DEFAULT_CHAT_TEMPLATE


@pytest.fixture(scope="module")
def tok(tiny_model_dir):
    return Tokenizer.from_pretrained(tiny_model_dir)


def test_supervised_labels_cover_exactly_the_answer_and_end_of_turn(tok):
    item = SupervisedDataset([{"input": "What is 2 + 2?", "answer": "4."}], tok, 128)[0]
    prompt = tok.encode("<|im_start|>user\nWhat is 2 + 2?<|im_end|>\n<|im_start|>assistant\n")
    answer = tok.encode("4.<|im_end|>")
    assert item["input_ids"] == prompt + answer
    assert item["labels"] == [IGNORE_INDEX] * len(prompt) + answer
    assert tok.eos_token_id in answer


def test_multi_turn_dialogue_trains_on_every_assistant_turn_only(tok):
    sample = {"dialogue": ["Hi", "Hello!", "Add 1 and 2.", "3."]}
    item = SupervisedDataset([sample], tok, 128)[0]
    text = tok.apply_chat_template(tok.chat_messages(sample["dialogue"]), add_generation_prompt=False)
    assert tok.decode(item["input_ids"], skip_special_tokens=False) == text.rstrip("\n")  # ends at the last eos
    trained = tok.decode([t for t in item["labels"] if t != IGNORE_INDEX], skip_special_tokens=False)
    assert trained == "Hello!<|im_end|>\n3.<|im_end|>"


def test_messages_rows_train_on_assistant_turns_only_never_on_system_user_or_tool(tok, tmp_path):
    from alignment.data import RawDataset
    call = '<tool_call>{"name": "calculator", "arguments": {"expression": "12 * 34"}}</tool_call>'
    messages = [{"role": "system", "content": "Tools: calculator"}, {"role": "user", "content": "12 * 34?"},
                {"role": "assistant", "content": call}, {"role": "tool", "content": "408"},
                {"role": "assistant", "content": "The answer is 408."}]
    path = tmp_path / "traces.jsonl"
    path.write_text(json.dumps({"messages": messages}) + "\n")
    item = SupervisedDataset(RawDataset.load("jsonl", path=str(path)), tok, 256)[0]
    text = tok.apply_chat_template(messages, add_generation_prompt=False)
    assert tok.decode(item["input_ids"], skip_special_tokens=False) == text.rstrip("\n")
    trained = tok.decode([t for t in item["labels"] if t != IGNORE_INDEX], skip_special_tokens=False)
    assert trained == f"{call}<|im_end|>\nThe answer is 408.<|im_end|>"  # the tool's 408 is context, not a target


def test_messages_rows_with_an_unknown_role_or_no_final_answer_name_the_line(tmp_path):
    from alignment.data import DataFormatError, RawDataset
    path = tmp_path / "bad.jsonl"
    for messages, says in (([{"role": "user", "content": "hi"}, {"role": "robot", "content": "x"}], "role 'robot'"),
                           ([{"role": "user", "content": "hi"}], "must end with an assistant message")):
        path.write_text(json.dumps({"messages": [{"role": "user", "content": "ok"},
                                                 {"role": "assistant", "content": "ok"}]}) + "\n"
                        + json.dumps({"messages": messages}) + "\n")
        with pytest.raises(DataFormatError, match=f"bad.jsonl line 2: 'messages' .*{says}"):
            RawDataset.load("jsonl", path=str(path))


def test_truncation_and_dropping_are_counted(tok):
    long_answer = "word " * 200
    data = SupervisedDataset([{"input": "Hi", "answer": long_answer}, {"input": "x " * 300, "answer": "y"}], tok, 32)
    assert len(data) == 1 and len(data[0]["input_ids"]) == 32
    assert data.stats == {"truncated": 2, "dropped_prompt_too_long": 1}


def test_preference_pairs_follow_the_better_flag_and_share_the_prompt(tok):
    raw = [{"input": "Q", "answer": "bad", "other_answer": "good", "better": False}]
    item = PreferenceDataset(raw, tok, 64)[0]
    prompt = tok.encode(format_prompt(tok, raw[0]))
    assert item["better_input_ids"] == prompt + tok.encode("good<|im_end|>")
    assert item["worse_input_ids"] == prompt + tok.encode("bad<|im_end|>")


def test_prompt_only_deduplicates_and_ends_with_the_generation_prompt(tok):
    data = PromptOnlyDataset([{"input": "Hi"}, {"input": "Hi"}, {"input": "Bye"}], tok, 64)
    assert len(data) == 2 and data.stats["duplicates"] == 1
    assert tok.decode(data[0]["input_ids"], skip_special_tokens=False).endswith("<|im_start|>assistant\n")


def test_collators_pad_right_for_training_and_left_for_generation():
    batch = collate_supervised([{"input_ids": [5, 6, 7], "labels": [-100, 6, 7]},
                                {"input_ids": [8], "labels": [8]}], pad_token_id=0)
    np.testing.assert_array_equal(batch["input_ids"], [[5, 6, 7], [8, 0, 0]])
    np.testing.assert_array_equal(batch["attention_mask"], [[1, 1, 1], [1, 0, 0]])
    np.testing.assert_array_equal(batch["labels"], [[-100, 6, 7], [8, -100, -100]])
    prompts = collate_prompts([{"input_ids": [5, 6, 7]}, {"input_ids": [8]}], pad_token_id=9)
    np.testing.assert_array_equal(prompts["input_ids"], [[5, 6, 7], [9, 9, 8]])
    np.testing.assert_array_equal(prompts["attention_mask"], [[1, 1, 1], [0, 0, 1]])
    pairs = collate_preference([{"better_input_ids": [1, 2], "worse_input_ids": [1]},
                                {"better_input_ids": [3], "worse_input_ids": [3, 4, 5]}], pad_token_id=0)
    np.testing.assert_array_equal(pairs["input_ids"], [[1, 2, 0], [3, 0, 0], [1, 0, 0], [3, 4, 5]])


def test_default_template_for_checkpoints_without_one(tok):
    plain = Tokenizer(tok._tok, {"eos_token": "<|im_end|>"}, "plain")
    assert plain.chat_template == DEFAULT_CHAT_TEMPLATE
    text = plain.apply_chat_template([{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Yo"}],
                                     add_generation_prompt=False)
    assert text == "BEGINNING OF CONVERSATION: USER: Hi ASSISTANT:Yo<|im_end|>"
    assert plain.apply_chat_template([{"role": "user", "content": "Hi"}]) == \
        "BEGINNING OF CONVERSATION: USER: Hi ASSISTANT:"


@pytest.mark.parametrize("template, fragment", [
    ("{{ ''.__class__.__mro__ }}", "the chat template failed: SecurityError: access to attribute '__class__'"),
    ("{{ raise_exception('Conversation roles must alternate') }}", "failed: TemplateError: Conversation roles"),
    ("{% for m in messages %}{{ m['content'] }", "the chat template does not compile: line 1:"),
])
def test_a_chat_template_that_fails_is_a_one_line_error_naming_the_tokenizer(tiny_model_dir, template, fragment):
    tokenizer = Tokenizer.from_pretrained(tiny_model_dir)
    tokenizer.chat_template = template
    with pytest.raises(ValueError, match=re.escape(fragment)) as err:
        tokenizer.apply_chat_template([{"role": "user", "content": "hi"}])
    assert str(err.value).startswith(f"{tiny_model_dir}: ") and "\n" not in str(err.value)
