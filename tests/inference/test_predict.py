"""tools/predict.py (alignment/inference/): batched KV-cache decoding through the exported program gives the
dynamic model's tokens."""
import io
import json
import os

import paddle
import pytest

from alignment.models import GenerationConfig, LlamaForCausalLM, Tokenizer, generate
from alignment.commands import export_model, predict
from alignment.inference import batch_generation

PROMPTS = ["Say hi.", "What is 7 + 5?", "Tell me a story about a cat and a dog who became good friends at last.",
           "Why?", "List three colours of the rainbow, then one more.", "Hello there", "2 + 2 =",
           "Write one short cheerful sentence about getting the job you wanted."]
SAMPLING = ["--do-sample", "--temperature", "0.8", "--top-k", "40", "--top-p", "0.9", "--repetition-penalty", "1.2"]


@pytest.fixture(scope="module")
def exported(tiny_model_dir, tmp_path_factory):
    return export_model.main(["--model", tiny_model_dir, "--output", str(tmp_path_factory.mktemp("exp") / "out"),
                              "--no-progress"])


@pytest.fixture(scope="module")
def prompts_file(tmp_path_factory):
    """The prompts as JSON lines (every other one, with an extra key) and plain text lines mixed."""
    path = tmp_path_factory.mktemp("prompts") / "prompts.txt"
    lines = [json.dumps({"prompt": p, "id": i}) if i % 2 else p for i, p in enumerate(PROMPTS)]
    path.write_text("\n".join(lines) + "\n\n")
    return str(path)


def run(exported, *args):
    """predict.main on the exported model, 10 new tokens, no progress bar."""
    return predict.main(["--model", exported, "--max-new-tokens", "10", "--no-progress", *args])


def dynamic(model_dir, prompts, batch_size, seed=None, **options):
    """The dynamic model's `generate` on the same left-padded batches: each prompt's new token ids."""
    model = LlamaForCausalLM.from_pretrained(model_dir)
    model.eval()
    tokenizer = Tokenizer.from_pretrained(model_dir)
    config = GenerationConfig(max_new_tokens=10, eos_token_id=model.config.eos_token_ids,
                              pad_token_id=tokenizer.pad_token_id, **options)
    rows = [tokenizer.encode(tokenizer.apply_chat_template(tokenizer.chat_messages(p)), add_special_tokens=True)
            for p in prompts]
    if seed is not None:
        paddle.seed(seed)
    out = []
    for first in range(0, len(rows), batch_size):
        out += batch_generation.generate_rows(model, rows[first: first + batch_size], config)
    return out


def test_greedy_tokens_equal_the_dynamic_model_with_left_padded_batches(exported, prompts_file, tiny_model_dir,
                                                                       tmp_path):
    out = tmp_path / "out.jsonl"
    results = run(exported, "--prompts", prompts_file, "--output", str(out), "--batch-size", "3")
    assert [r["response_ids"] for r in results] == dynamic(tiny_model_dir, PROMPTS, 3, do_sample=False)
    written = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["prompt"] for r in written] == PROMPTS and written[1]["id"] == 1 and "id" not in written[0]
    assert all(r["new_tokens"] == len(r["response_ids"]) and r["prompt_tokens"] > 0 for r in written)
    assert len({r["prompt_tokens"] for r in written}) > 4  # lengths differ: the batches are left-padded


def test_sampling_with_a_seed_is_reproducible_and_is_the_dynamic_models(exported, prompts_file, tiny_model_dir):
    first = run(exported, "--prompts", prompts_file, "--batch-size", "4", "--seed", "7", *SAMPLING)
    again = run(exported, "--prompts", prompts_file, "--batch-size", "4", "--seed", "7", *SAMPLING)
    ids = [r["response_ids"] for r in first]
    assert ids == [r["response_ids"] for r in again]
    assert ids == dynamic(tiny_model_dir, PROMPTS, 4, seed=7, do_sample=True, temperature=0.8, top_k=40, top_p=0.9,
                          repetition_penalty=1.2)
    assert ids != [r["response_ids"] for r in run(exported, "--prompts", prompts_file, "--batch-size", "4",
                                                  "--seed", "8", *SAMPLING)]


def test_stdin_and_repeated_prompt_options(exported, monkeypatch, capsys):
    monkeypatch.setattr("sys.stdin", io.StringIO('Say hi.\n{"prompt": "Why?"}\n'))
    run(exported)
    captured = capsys.readouterr()
    lines = [json.loads(line) for line in captured.out.splitlines()]
    assert [r["prompt"] for r in lines] == ["Say hi.", "Why?"]
    assert "predict: 2 prompts" in captured.err and "tokens/s" in captured.err
    by_option = run(exported, "--prompt", "Say hi.", "--prompt", "Why?")
    assert [r["response_ids"] for r in by_option] == [r["response_ids"] for r in lines]


def test_raw_prompts_skip_the_chat_template(exported):
    templated, raw = run(exported, "--prompt", "Say hi."), run(exported, "--prompt", "Say hi.", "--raw")
    assert raw[0]["prompt_tokens"] < templated[0]["prompt_tokens"]


@pytest.mark.parametrize("case, fragment", [
    ("old export", "re-export"),
    ("no export", "no inference/export.json"),
    ("prompt without key", "prompts.jsonl line 2: a JSON line needs a \"prompt\" key"),
    ("turns that are not text", "prompts.jsonl line 1: a JSON line needs a \"prompt\" key"),
    ("a line too long to read", "prompts.jsonl line 2: longer than 1000000 characters"),
    ("too long", "max_position_embeddings"),
    ("bad option", "--top-p: must be a number in (0, 1]"),
])
def test_bad_inputs_fail_with_one_line(exported, tmp_path, capsys, case, fragment):
    model, args = exported, ["--prompt", "Say hi."]
    if case == "old export":
        model = str(tmp_path / "old")
        os.makedirs(os.path.join(model, "inference"))
        with open(os.path.join(model, "inference", "export.json"), "w") as f:
            json.dump({"max_length": 48, "batch_size": 1}, f)
    if case == "no export":
        model = str(tmp_path)
    if case == "prompt without key":
        (tmp_path / "prompts.jsonl").write_text('{"prompt": "ok"}\n{"text": "no prompt key"}\n')
        args = ["--prompts", str(tmp_path / "prompts.jsonl")]
    if case == "turns that are not text":
        (tmp_path / "prompts.jsonl").write_text('{"prompt": ["hi", 3]}\n')
        args = ["--prompts", str(tmp_path / "prompts.jsonl")]
    if case == "a line too long to read":
        (tmp_path / "prompts.jsonl").write_text("ok\n" + "x" * 1_000_001 + "\n")
        args = ["--prompts", str(tmp_path / "prompts.jsonl")]
    if case == "too long":
        args = ["--prompt", "word " * 600]
    if case == "bad option":
        args += ["--do-sample", "--top-p", "0"]
    with pytest.raises(SystemExit) as info:
        predict.main(["--model", model, "--no-progress", *args])
    err = capsys.readouterr().err
    assert info.value.code == 2 and fragment in err and "Traceback" not in err, err
