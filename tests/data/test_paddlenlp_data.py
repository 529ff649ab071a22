"""PaddleNLP's documented data formats (llm/README.md, llm/docs/dpo.md, llm/alignment/rl/README.md) read as they are:
a bare path (or PaddleNLP's comma-separated list) in train_dataset_path / train_datasets is read in the format its
first row's keys show (alignment/data/detect.py, alignment/data/paddlenlp_files.py). The files here are written in
PaddleNLP's exact documented shapes."""
import json
import math
import os

import pytest

from alignment.data import DataFormatError, MixedRawDataset, RawDataset
from tests.helpers import REPO, read_metrics

FIXTURES = os.path.join(REPO, "tests", "fixtures", "paddlenlp")


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows), encoding="utf-8")
    return str(path)


# llm/README.md "精调 数据准备": src / tgt strings, or lists for a dialogue
SFT_ROWS = [{"src": "Give three tips for staying healthy.", "tgt": "Eat well, sleep enough, move every day."},
            {"src": ["Hi there.", "What is two plus two?"], "tgt": ["Hello! How can I help?", "Four."]}]
# llm/docs/dpo.md: response holds chosen and rejected, "sort 值小的是 rejected, sort 值大的是 chosen"
PAIR_ROWS = [{"src": ["Say something kind."], "tgt": [], "response": ["You are doing great.", "Go away."],
              "sort": [1, 0]},
             {"src": ["Hi.", "Recommend a book."], "tgt": ["Hello!"], "response": ["No.", "Try Middlemarch."],
              "sort": [0, 1]},
             {"src": "Name a fruit.", "tgt": [], "response": ["Rock.", "Apple."], "sort": [2, 5]}]
# llm/README.md "KTO 数据准备": one response, sort [1] chosen / [0] rejected
KTO_ROWS = [{"src": ["Say something kind."], "tgt": [], "response": ["You are doing great."], "sort": [1]},
            {"src": ["Say something kind."], "tgt": [], "response": ["Go away."], "sort": [0]},
            {"src": ["Hi.", "Recommend a book."], "tgt": ["Hello!"], "response": ["Try Middlemarch."], "sort": [1]},
            {"src": ["Name a fruit."], "tgt": [], "response": ["Rock."], "sort": [0]}]
# llm/alignment/rl/README.md: src already templated, tgt the label
RL_ROWS = [{"src": ["<|im_start|>user\nWhat is 2+3?<|im_end|>\n<|im_start|>assistant\n"], "tgt": ["5"]},
           {"src": ["<|im_start|>user\nWhat is 4+4?<|im_end|>\n<|im_start|>assistant\n"], "tgt": ["8"]}]


def samples(spec, **options):
    data = MixedRawDataset(spec, options=options)
    return [data[i] for i in range(len(data))], data


def test_sft_rows_single_and_multi_turn(tmp_path):
    rows, data = samples(write_jsonl(tmp_path / "sft.jsonl", SFT_ROWS))
    assert data.datasets[0].format == "paddlenlp-sft"
    assert rows[0] == {"input": SFT_ROWS[0]["src"], "answer": SFT_ROWS[0]["tgt"]}
    turns = ["Hi there.", "Hello! How can I help?", "What is two plus two?", "Four."]
    assert rows[1] == {"input": turns[:-1], "answer": "Four.", "dialogue": turns}


def test_preference_rows_choose_the_larger_sort_whatever_the_order(tmp_path):
    rows, data = samples(write_jsonl(tmp_path / "pairs.jsonl", PAIR_ROWS))
    assert data.datasets[0].format == "paddlenlp-preference"
    assert [(row["answer"], row["other_answer"], row["better"]) for row in rows] == [
        ("You are doing great.", "Go away.", True), ("Try Middlemarch.", "No.", True), ("Apple.", "Rock.", True)]
    assert rows[1]["input"] == ["Hi.", "Hello!", "Recommend a book."]  # history before the last user turn
    assert rows[2]["input"] == "Name a fruit."


def test_kto_rows_sort_one_is_desirable(tmp_path):
    rows, data = samples(write_jsonl(tmp_path / "kto.jsonl", KTO_ROWS))
    assert data.datasets[0].format == "paddlenlp-kto"
    assert [(row["answer"], row["desirable"]) for row in rows] == [
        ("You are doing great.", True), ("Go away.", False), ("Try Middlemarch.", True), ("Rock.", False)]


def test_rl_prompts_with_prompt_key_and_response_key_and_a_comma_separated_list(tmp_path):
    first = write_jsonl(tmp_path / "a.jsonl", RL_ROWS)
    renamed = [{"question": row["src"][0], "label": row["tgt"][0]} for row in RL_ROWS]
    second = write_jsonl(tmp_path / "b.jsonl", renamed)
    rows, _ = samples(first)
    assert rows == [{"input": row["src"][0], "answer": row["tgt"][0]} for row in RL_ROWS]
    # prompt_key / response_key select the columns (PaddleNLP's RLHFDataset reads raw_sample[prompt_key])
    rows, data = samples(f"{second},{second}", prompt_key="question", response_key="label")
    assert len(data.datasets) == 2 and rows[:2] == [{"input": r["question"], "answer": r["label"]} for r in renamed]
    with pytest.raises(DataFormatError, match=r"b.jsonl line 1: the keys of the first row \(label, question\) fit "
                                              r"no data format .*paddlenlp-sft \(src, tgt\).*user_dataset_modules"):
        samples(second)  # without the keys the columns are nobody's


@pytest.mark.parametrize("row, problem", [
    ({"src": ["q"], "tgt": [], "response": ["a", "b"], "sort": [1, 1]}, r"the two 'sort' values are equal"),
    ({"src": ["q"], "tgt": [], "response": ["a", "b"], "sort": [1]}, r"'sort' must be a list of 2 number"),
    ({"src": ["q"], "tgt": [], "response": ["a"], "sort": [2]}, r"'sort' must be \[1\] \(desirable\) or \[0\]"),
    ({"src": ["q1", "q2"], "tgt": [], "response": ["a", "b"], "sort": [1, 0]}, r"'tgt' must have one entry fewer"),
])
def test_a_bad_row_names_file_line_and_key(tmp_path, row, problem):
    good = PAIR_ROWS[0] if len(row["response"]) == 2 else KTO_ROWS[0]
    path = write_jsonl(tmp_path / "bad.jsonl", [good, row])
    with pytest.raises(DataFormatError, match=rf"bad.jsonl line 2: {problem}"):
        samples(path)


def test_an_unknown_name_says_which_formats_exist_and_how_to_register():
    with pytest.raises(ValueError) as info:
        RawDataset.load("./data/train.jsonl")  # PaddleNLP's default path, absent here
    message = str(info.value)
    assert "no registered name and no such file" in message and "paddlenlp-sft" in message
    assert "RawDataset subclass with a NAME in a user_dataset_modules file" in message


def test_chat_template_none_uses_the_prompt_as_written(tmp_path, tiny_model_dir):
    from alignment.config.data import DataArguments
    from alignment.data.tokenized import PromptOnlyDataset
    from alignment.training.setup import Invocation, load_inputs

    path = write_jsonl(tmp_path / "rl.jsonl", RL_ROWS)
    prompts = {}
    for template in (None, "none"):
        data_args = DataArguments(train_datasets=path, chat_template=template)
        tokenizer, train, _ = load_inputs(tiny_model_dir, data_args, 0, Invocation({}, None, None))
        items = PromptOnlyDataset(train, tokenizer, 512)
        prompts[template] = [tokenizer.decode(item["input_ids"], skip_special_tokens=False) for item in items]
    assert sorted(prompts["none"]) == sorted(row["src"][0] for row in RL_ROWS)  # nothing added around the prompt
    assert all(row["src"][0] in text and text != row["src"][0] for row, text in zip(RL_ROWS, prompts[None]))


def one_step(entry, config, model, data, out, *extra):
    entry.main([config, "--model_name_or_path", model, "--train_dataset_path", data, "--dev_dataset_path", "",
                "--output_dir", str(out), "--tensor_parallel_degree", "1", "--max_steps", "1", *extra])
    assert [row["step"] for row in read_metrics(out)] == [1]
    return read_metrics(out)[0], json.load(open(os.path.join(out, "args.json")))


def test_paddlenlp_dpo_file_trains_on_paddlenlp_pairs(tmp_path, tiny_model_dir):
    from alignment.dpo import run_dpo

    data = write_jsonl(tmp_path / "train.jsonl", PAIR_ROWS)
    row, args = one_step(run_dpo, os.path.join(FIXTURES, "dpo_argument.json"), tiny_model_dir, data, tmp_path / "o",
                         "--max_seq_len", "64")
    assert args["loss_type"] == "sigmoid" and row["rewards/margin"] == 0.0  # step 1: the policy is the reference,
    assert row["loss"] == pytest.approx(math.log(2), rel=1e-6)  # so every pair's DPO loss is -log s(0)


def test_paddlenlp_sft_rows_train_sft(tmp_path, tiny_model_dir):
    from alignment.sft import run_sft

    data = write_jsonl(tmp_path / "train.jsonl", SFT_ROWS)
    row, args = one_step(run_sft, os.path.join(REPO, "config", "tiny", "sft_argument.json"), tiny_model_dir, data,
                         tmp_path / "o", "--per_device_train_batch_size", "2")
    assert args["train_datasets"] == data and row["loss"] > 0


def test_ppo_on_paddlenlp_rl_rows_with_chat_template_none(tmp_path, tiny_model_dir, tiny_reward_dir, capsys):
    """PaddleNLP's RL prompts (src already templated, tgt the label) train a PPO step with chat_template none; the
    reward model reads the same raw text (no re-tokenizing through another template), as in PaddleNLP."""
    from alignment.ppo import run_ppo

    data = write_jsonl(tmp_path / "rl.jsonl", RL_ROWS)
    out = tmp_path / "out"
    run_ppo.main([os.path.join(REPO, "config", "tiny", "ppo_argument.json"), "--actor_model_name_or_path",
                  tiny_model_dir, "--reward_model_name_or_path", tiny_reward_dir, "--train_datasets", data,
                  "--eval_datasets", "", "--chat_template", "none", "--output_dir", str(out), "--max_steps", "1",
                  "--max_new_tokens", "4", "--per_device_prompt_batch_size", "2", "--per_device_train_batch_size",
                  "2", "--update_iters", "1", "--disable_tqdm", "true"])
    printed = capsys.readouterr().out
    assert "prompts: 2 train" in printed and "re-tokenized for the reward model" not in printed
    assert [row["step"] for row in read_metrics(out)] == [1]
