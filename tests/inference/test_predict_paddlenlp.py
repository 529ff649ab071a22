"""PaddleNLP's command lines for export and predict (llm/predict/export_model.py, llm/predict/predictor.py, as in
llm/docs/predict/llama.md and inference.md) run against our export: its flags, its src/tgt data file, its output
file, its decoding keys; bad flags and abbreviations are one error line, exit 2."""
import json
import os
from argparse import Namespace

import pytest

from alignment.commands import export_model, predict
from alignment.commands.paddlenlp_flags import decoding

DATA = [{"tgt": "", "src": "Write an outline of a 300-word story."},
        {"tgt": "", "src": "List five questions for a science-fiction writer."},
        {"src": ["Hi", "Why is the sky blue?"], "tgt": ["Hello! How can I help?", ""]}]


@pytest.fixture(scope="module")
def exported(tiny_model_dir, tmp_path_factory):
    """llama.md's export command with our tiny model and dtype."""
    out = str(tmp_path_factory.mktemp("exp") / "exported_model")
    export_model.main(["--model_name_or_path", tiny_model_dir, "--output_path", out, "--dtype", "float32",
                       "--inference_model", "1", "--block_attn", "1", "--no-progress"])
    return out


@pytest.fixture(scope="module")
def data_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("data") / "data.json"
    path.write_text("".join(json.dumps(row, ensure_ascii=False) + "\n" for row in DATA))
    return str(path)


def paddlenlp(model, data_file, out, *extra):
    """llama.md's static-graph predict command, with a data file, an output file, CPU and 8 new tokens."""
    return predict.main(["--model_name_or_path", model, "--dtype", "float32", "--mode", "static", "--inference_model",
                         "1", "--block_attn", "1", "--data_file", data_file, "--output_file", str(out), "--device",
                         "cpu", "--max_length", "8", "--no-progress", *extra])


def test_paddlenlp_commands_write_paddlenlp_output_and_equal_our_flags(exported, data_file, tmp_path, capsys):
    results = paddlenlp(exported, data_file, tmp_path / "output.json", "--decode_strategy", "greedy_search")
    rows = [json.loads(line) for line in (tmp_path / "output.json").read_text().splitlines()]
    assert [sorted(r) for r in rows] == [["output", "src", "tgt"]] * 3
    assert [(r["src"], r["tgt"]) for r in rows] == [(d["src"], d["tgt"]) for d in DATA]
    assert [r["output"] for r in rows] == [r["response"] for r in results] and all(r["output"] for r in rows)
    assert results[2]["prompt"] == ["Hi", "Hello! How can I help?", "Why is the sky blue?"]  # rounds in order
    assert all(r["new_tokens"] <= 8 for r in results)
    err = capsys.readouterr().err
    assert "--inference_model has no effect" in err and "--block_attn has no effect" in err
    ours = predict.main(["--model", exported, "--prompts", data_file, "--max-new-tokens", "8", "--no-progress"])
    assert [r["response_ids"] for r in ours] == [r["response_ids"] for r in results]


def test_mode_dynamic_runs_the_checkpoint_with_the_exports_tokens(exported, tiny_model_dir, data_file, tmp_path):
    static = paddlenlp(exported, data_file, tmp_path / "a.json", "--decode_strategy", "greedy_search")
    for model in (tiny_model_dir, exported):  # a checkpoint (the default there is dynamic), an export's hf/
        dynamic = predict.main(["--model_name_or_path", model, "--mode", "dynamic", "--data_file", data_file,
                                "--max_length", "8", "--decode_strategy", "greedy_search", "--no-progress"])
        assert [r["response_ids"] for r in dynamic] == [r["response_ids"] for r in static]
    auto = predict.main(["--model", tiny_model_dir, "--prompt", DATA[0]["src"], "--max-new-tokens", "8",
                         "--no-progress"])
    assert auto[0]["response_ids"] == static[0]["response_ids"]


def test_src_length_min_length_and_max_length(exported, data_file, tmp_path):
    results = paddlenlp(exported, data_file, tmp_path / "o.json", "--src_length", "5", "--min_length", "6",
                        "--max_length", "6", "--decode_strategy", "greedy_search")
    assert [r["prompt_tokens"] for r in results] == [5, 5, 5]
    assert [r["new_tokens"] for r in results] == [6, 6, 6]


def test_a_sampling_flag_alone_samples_as_paddlenlp_with_a_notice(exported, data_file, tmp_path, capsys):
    implied = paddlenlp(exported, data_file, tmp_path / "a.json", "--top_p", "0.9", "--seed", "3")
    assert "--top_p without --do-sample or --decode_strategy: sampling" in capsys.readouterr().err
    spelled = paddlenlp(exported, data_file, tmp_path / "b.json", "--decode_strategy", "sampling", "--top_p", "0.9",
                        "--temperature", "0.95", "--seed", "3")
    greedy = paddlenlp(exported, data_file, tmp_path / "c.json", "--decode_strategy", "greedy_search")
    assert [r["response_ids"] for r in implied] == [r["response_ids"] for r in spelled]
    assert [r["response_ids"] for r in implied] != [r["response_ids"] for r in greedy]


def args(**given):
    base = {"do_sample": False, "decode_strategy": None, "temperature": None, "top_k": None, "top_p": None}
    return Namespace(**{**base, **given})


@pytest.mark.parametrize("given, expected", [
    ({}, (False, None)),
    ({"decode_strategy": "greedy_search", "top_k": 1, "top_p": 1.0}, (False, None)),
    ({"decode_strategy": "sampling"}, (True, {"temperature": 0.95, "top_k": 0, "top_p": 0.7})),
    ({"top_k": 5}, (True, {"temperature": 0.95, "top_k": 5, "top_p": 0.7})),
    ({"do_sample": True, "top_p": 0.8}, (True, {"temperature": 1.0, "top_k": 0, "top_p": 0.8})),
])
def test_decoding_keys(given, expected):
    do_sample, values, _ = decoding(args(**given))
    assert do_sample == expected[0] and (expected[1] is None or values == expected[1])


@pytest.mark.parametrize("argv, fragment", [
    (["--decode_strategy", "beam_search"], "beam_search is not built"),
    (["--decode_strategy", "greedy_search", "--top_p", "0.5"], "--top_p 0.5 is a sampling option"),
    (["--decode_strategy", "greedy_search", "--do-sample"], "contradicts"),
    (["--data_fil", "x.json"], "unrecognized arguments: --data-fil"),  # an abbreviation of --data_file
    (["--mod", "static"], "unrecognized arguments: --mod"),
    (["--mode", "fast"], "--mode: invalid choice"),
    (["--inference_model", "maybe"], "--inference-model"),
    (["--output", "a.json", "--output_file", "b.json"], "not allowed with argument"),
    (["--device", "xpu"], "--device: invalid choice"),
    (["--dtype", "bfloat16"], "--dtype bfloat16: "),
    (["--mode", "static", "--model_name_or_path", "{ckpt}"], "no inference/export.json"),
    (["--data_file", "{bad}"], "bad.json line 1: \"src\" must be a string"),
])
def test_bad_flags_are_one_line_exit_2(exported, tiny_model_dir, tmp_path, capsys, argv, fragment):
    (tmp_path / "bad.json").write_text('{"src": ["a", "b"], "tgt": []}\n')
    argv = [a.format(ckpt=tiny_model_dir, bad=tmp_path / "bad.json") for a in argv]
    model = [] if "--model_name_or_path" in argv else ["--model_name_or_path", exported]
    with pytest.raises(SystemExit) as info:
        predict.main([*model, "--prompt", "hi", "--no-progress", *argv])
    err = capsys.readouterr().err
    assert info.value.code == 2 and fragment in err and "Traceback" not in err, err
    assert len([line for line in err.splitlines() if line.startswith("error")]) == 1, err


def test_export_refuses_another_dtype_and_writes_nothing(tiny_model_dir, tmp_path, capsys):
    with pytest.raises(SystemExit) as info:
        export_model.main(["--model_name_or_path", tiny_model_dir, "--output_path", str(tmp_path / "out"),
                           "--dtype", "bfloat16", "--no-progress"])
    err = capsys.readouterr().err
    assert info.value.code == 2 and "--dtype bfloat16: " in err and "is float32" in err, err
    assert not os.path.exists(tmp_path / "out")
    with pytest.raises(SystemExit) as info:
        export_model.main(["--model_name_or_path", tiny_model_dir, "--output_path", str(tmp_path / "out"),
                           "--inference_mod", "1"])  # an abbreviation of --inference_model
    assert info.value.code == 2 and "unrecognized arguments: --inference-mod 1" in capsys.readouterr().err
    assert not os.path.exists(tmp_path / "out")
