"""The bad-input catalogue of data files and argument files, by class: how a file is stored (compressed, another
format, another encoding, not a regular file), how its JSON is written (too deep, lone surrogates, duplicate keys,
NaN), the typed fields of every built-in format, and every number of the argument files. Each case runs a stage's
entry point and must exit 2 with one line naming the file, line or key, and write nothing
(tests/bad_input_harness.py)."""
import gzip
import json
import os

import pytest

from alignment.dpo import run_dpo, run_kto
from alignment.ppo import run_ppo
from alignment.rm import run_reward
from alignment.sft import run_sft
from tests.bad_input_harness import case, lines, run_case, write
from tests.config.test_bad_inputs import GOOD_PAIR, GOOD_SFT, PPO_CONFIG, RM_CONFIG, SFT_CONFIG
from tests.helpers import REPO

GOOD_PREFERENCE = {"src": "Q?", "tgt": [], "response": ["Yes.", "No."], "sort": [1, 0]}
DEEP = 100_000


def common(t, m):
    return ["--model_name_or_path", m, "--output_dir", str(t / "out"), "--disable_tqdm", "--eval_datasets", "",
            "--max_steps", "1"]


def sft(*extra):
    """An SFT run of the tiny model (one step) with `extra` flags, once its inputs are written."""
    return lambda t, m: lambda: run_sft.main([SFT_CONFIG, *common(t, m), *extra])


def sft_file(spec_name, name, rows):
    """SFT on a data file holding `rows` (JSON values, or str / bytes lines), read as `spec_name`."""
    def build(t, m):
        path = lines(t / name, rows)
        return lambda: run_sft.main([SFT_CONFIG, *common(t, m), "--train_datasets", f"{spec_name}:1.0:{path}"])
    return build


def sft_raw(name, data: bytes, spec_name="alpaca"):
    def build(t, m):
        path = write(t / name, data)
        return lambda: run_sft.main([SFT_CONFIG, *common(t, m), "--train_datasets",
                                     f"{spec_name}:1.0:{path}" if spec_name else path])
    return build


def rm_file(spec_name, rows, name="data.jsonl"):
    def build(t, m):
        path = lines(t / name, rows)
        return lambda: run_reward.main([RM_CONFIG, *common(t, m), "--train_datasets", f"{spec_name}:1.0:{path}"])
    return build


def stage_file(run, config, spec_name, rows, *extra, name="data.jsonl"):
    """A stage's entry point (`run`, its tiny argument file `config`) on a data file holding `rows`."""
    def build(t, m):
        path = lines(t / name, rows)
        return lambda: run.main([os.path.join(REPO, "config", "tiny", config), *common(t, m), "--train_datasets",
                                 f"{spec_name}:1.0:{path}", *extra])
    return build


def ppo_prompts(data: bytes):
    def build(t, m):
        path = write(t / "prompts.jsonl", data)
        return lambda: run_ppo.main([PPO_CONFIG, *common(t, m)[2:], "--actor_model_name_or_path", m,
                                     "--reward_model_name_or_path", "", "--reward_funcs", "sentiment",
                                     "--train_datasets", f"prompt-only:1.0:{path}"])
    return build


def sft_args(text, name="args.json"):
    """SFT from an argument file whose text is `text` (str or bytes) with {model} and {out} filled in."""
    def build(t, m):
        if isinstance(text, str):
            body = text.replace("{model}", m).replace("{out}", str(t / "out"))
        else:
            body = text.replace(b"{model}", m.encode()).replace(b"{out}", str(t / "out").encode())
        path = write(t / name, body)
        return lambda: run_sft.main([path, "--disable_tqdm"])
    return build


def json_args(**values):
    """An argument file's JSON text: the tiny SFT file with `values` changed."""
    data = {**json.load(open(SFT_CONFIG)), "model_name_or_path": "{model}", "output_dir": "{out}",
            "eval_datasets": "", "max_steps": 1, **values}
    return json.dumps(data, indent=2)


def fifo(t, m):
    path = str(t / "data.jsonl")
    os.mkfifo(path)
    return ["alignment/sft/run_sft.py", SFT_CONFIG, *common(t, m), "--train_datasets", f"alpaca:1.0:{path}"]


def deep_row(t, m):
    path = lines(t / "data.jsonl", [GOOD_SFT, '{"instruction": "Hi", "output": ' + '{"a": ' * DEEP + "1"
                                    + "}" * DEEP + "}"])
    return ["alignment/sft/run_sft.py", SFT_CONFIG, *common(t, m), "--train_datasets", f"alpaca:1.0:{path}"]


def child_sft(*extra):
    return lambda t, m: ["alignment/sft/run_sft.py", SFT_CONFIG, *common(t, m), *extra]


def pair(**changes):
    return {**GOOD_PAIR, **changes}


CASES = [
    # --- how the data file is stored
    case("gzip bytes in a file named .jsonl", sft_raw("data.jsonl", gzip.compress(json.dumps(GOOD_SFT).encode())),
         "data.jsonl", "gzip-compressed"),
    case("a corrupt .jsonl.gz", sft_raw("data.jsonl.gz", b"\x1f\x8b\x08\x00garbage"), "data.jsonl.gz", "gzip"),
    case("a Parquet file", sft_raw("data.parquet", b"PAR1" + b"\x00" * 64 + b"PAR1"), "data.parquet", "Parquet"),
    case("a CSV file", sft_raw("data.csv", b"instruction,output\nSay hi.,Hi!\n"), "data.csv", "CSV",
         "JSON lines"),
    case("UTF-16 text", sft_raw("data.jsonl", (json.dumps(GOOD_SFT) + "\n").encode("utf-16")), "data.jsonl",
         "UTF-16"),
    case("a named pipe as the data file", fifo, "data.jsonl", "not a regular file"),
    case("a directory without the split's file", lambda t, m: (os.makedirs(t / "d"), sft(
        "--train_datasets", f"alpaca:1.0:{t / 'd'}")(t, m))[1], "No 'train' data file"),
    case("an empty data file", sft_file("alpaca", "data.jsonl", [b""]), "data.jsonl", "no rows"),
    # --- how its JSON is written
    case("a lone surrogate escape", sft_file("alpaca", "data.jsonl", [
        GOOD_SFT, '{"instruction": "x\\ud800y", "output": "z"}']), "data.jsonl line 2", "surrogate", "\\ud800"),
    case("JSON nested 100,000 deep on line 2", deep_row, "data.jsonl line 2", "nested too deeply"),
    case("JSON nested 100,000 deep in the first row of a bare path", sft_raw(
        "data.jsonl", ('{"prompt": ' + "[" * DEEP + "]" * DEEP + "}\n").encode(), spec_name=None),
         "data.jsonl line 1", "nested too deeply"),
    case("a duplicate key in a row", sft_file("alpaca", "data.jsonl", [
        GOOD_SFT, '{"instruction": "Hi", "output": "a", "output": "b"}']), "data.jsonl line 2",
         "'output' is given twice"),
    case("a row that is a string", sft_file("alpaca", "data.jsonl", [GOOD_SFT, '"just text"']),
         "data.jsonl line 2", "expected a JSON object"),
    case("garbage after a JSON array", sft_raw("data.json", b'[{"instruction": "a", "output": "b"}] x'),
         "data.json line 1", "JSON"),
    # --- the typed fields of the built-in formats
    case("PKU-SafeRLHF better_response_id \"0\" after an int", rm_file("PKU-SafeRLHF/train", [
        GOOD_PAIR, pair(better_response_id="0")]), "data.jsonl line 2", "'better_response_id' must be 0 or 1",
         "'0'"),
    case("PKU-SafeRLHF is_response_0_safe \"true\" after a bool", rm_file("PKU-SafeRLHF/train", [
        GOOD_PAIR, pair(is_response_0_safe="true")]), "data.jsonl line 2",
         "'is_response_0_safe' must be true or false", "'true'"),
    case("PKU-SafeRLHF is_response_1_safe \"false\" before bools", rm_file("PKU-SafeRLHF/train", [
        pair(is_response_1_safe="false"), GOOD_PAIR]), "data.jsonl line 1", "'is_response_1_safe'"),
    case("PKU-SafeRLHF is_response_1_safe 1", rm_file("PKU-SafeRLHF/train", [GOOD_PAIR, pair(is_response_1_safe=1)]),
         "data.jsonl line 2", "'is_response_1_safe' must be true or false, got 1"),
    case("PKU-SafeRLHF safer_response_id 0.5", rm_file("PKU-SafeRLHF/train", [GOOD_PAIR, pair(safer_response_id=0.5)]),
         "data.jsonl line 2", "'safer_response_id' must be 0 or 1"),
    case("PKU-SafeRLHF response_1 a number", rm_file("PKU-SafeRLHF/train", [GOOD_PAIR, pair(response_1=7)]),
         "data.jsonl line 2", "'response_1' must be a string"),
    case("hh-rlhf chosen a list", rm_file("hh-rlhf", [{"chosen": ["x"], "rejected": "\n\nHuman: a\n\nAssistant: b"}]),
         "data.jsonl line 1", "'chosen' must be a string"),
    case("PaddleNLP sort NaN", rm_file("paddlenlp-preference", [GOOD_PREFERENCE, '{"src": "Q?", "tgt": [], '
                                       '"response": ["Yes.", "No."], "sort": [NaN, 0]}']),
         "data.jsonl line 2", "'sort'", "finite"),
    case("PaddleNLP sort 1e999 (infinite)", rm_file("paddlenlp-preference", [GOOD_PREFERENCE, '{"src": "Q?", '
                                                    '"tgt": [], "response": ["Yes.", "No."], "sort": [1e999, 0]}']),
         "data.jsonl line 2", "'sort'", "finite"),
    case("PaddleNLP sort given as strings", rm_file("paddlenlp-preference", [
        GOOD_PREFERENCE, {**GOOD_PREFERENCE, "sort": ["1", "0"]}]), "data.jsonl line 2", "'sort'"),
    case("PaddleNLP sort true / false", rm_file("paddlenlp-preference", [
        GOOD_PREFERENCE, {**GOOD_PREFERENCE, "sort": [True, False]}]), "data.jsonl line 2", "'sort'"),
    case("PaddleNLP src a number", sft_file("paddlenlp-sft", "data.jsonl", [{"src": "a", "tgt": "b"},
                                                                          {"src": 5, "tgt": "b"}]),
         "data.jsonl line 2", "'src'"),
    case("alpaca output an object", sft_file("alpaca", "data.jsonl", [GOOD_SFT, {**GOOD_SFT, "output": {"a": 1}}]),
         "data.jsonl line 2", "'output' must be a string"),
    case("messages with a numeric role", sft_file("jsonl", "data.jsonl", [
        {"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]},
        {"messages": [{"role": 1, "content": "a"}, {"role": "assistant", "content": "b"}]}]),
         "data.jsonl line 2", "'messages'", "role 1"),
    case("dialogue with a number turn", sft_file("jsonl", "data.jsonl", [{"dialogue": ["a", 5]}]),
         "data.jsonl line 1", "'dialogue'"),
    case("a JSON array that is not closed", sft_raw("data.json", b'[{"instruction": "a", "output": "b"},\n'),
         "data.json line 2", "not closed"),
    case("a key null where a string is needed", sft_file("alpaca", "data.jsonl", [GOOD_SFT, {**GOOD_SFT,
                                                                                          "output": None}]),
         "data.jsonl line 2", "key 'output' is null"),
    # --- the same reader behind every stage
    case("DPO: hh-rlhf rejected a number", stage_file(run_dpo, "dpo_argument.json", "hh-rlhf", [
        {"chosen": "\n\nHuman: a\n\nAssistant: b", "rejected": 5}]), "data.jsonl line 1",
         "'rejected' must be a string"),
    case("KTO: label \"true\"", stage_file(run_kto, "dpo_argument.json", "kto", [
        {"prompt": "a", "completion": "b", "label": True}, {"prompt": "a", "completion": "c", "label": "true"}],
        "--loss_type", "kto"),
         "data.jsonl line 2", "'label' must be true or false"),
    case("KTO: PaddleNLP sort [2]", stage_file(run_kto, "dpo_argument.json", "paddlenlp-kto", [
        {"src": "a", "tgt": [], "response": ["b"], "sort": [1]}, {"src": "a", "tgt": [], "response": ["c"],
                                                                  "sort": [2]}], "--loss_type", "kto"),
         "data.jsonl line 2", "'sort' must be [1]"),
    case("PRM: a step label \"maybe\"", stage_file(run_reward, "rm_argument.json", "process-reward", [
        {"prompt": "Q", "steps": ["a", "b"], "labels": [True, "maybe"]}], "--process_reward", "true"),
         "data.jsonl line 1", "step label"),
    case("PPO: a non-UTF-8 prompts file", ppo_prompts(b'{"prompt": "Hi"}\n{"prompt": "caf\xe9"}\n'),
         "prompts.jsonl line 2", "UTF-8"),
    case("PPO: a prompt row nested 100,000 deep", ppo_prompts(b'{"prompt": "Hi"}\n{"prompt": ' + b"[" * DEEP
                                                               + b"]" * DEEP + b"}\n"),
         "prompts.jsonl line 2", "nested too deeply"),
    # --- every number of the argument files and flags
    case("max_steps beyond int64 (flag)", child_sft("--max_steps", str(2 ** 63)), "'max_steps'", "64 bits"),
    case("max_steps beyond int64 (file)", sft_args(json_args(max_steps=2 ** 63)), "args.json", "'max_steps'",
         "64 bits"),
    case("max_steps 1e300", sft_args(json_args(max_steps=1e300)), "'max_steps'"),
    case("seed beyond int64", sft("--seed", str(2 ** 64)), "'seed'", "64 bits"),
    case("seed below int64", sft("--seed", str(-2 ** 63 - 1)), "'seed'", "64 bits"),
    case("max_steps true", sft_args(json_args(max_steps=True)), "'max_steps'", "integer"),
    case("a flag given 2", sft_args(json_args(bf16=2)), "'bf16'", "true or false"),
    case("learning_rate NaN literal in the file", sft_args(json_args().replace('"learning_rate": 0.003',
                                                                               '"learning_rate": NaN')),
         "'learning_rate'", "finite"),
    case("learning_rate .nan in YAML", sft_args("model_name_or_path: {model}\noutput_dir: {out}\neval_datasets: ''\n"
                                                "train_datasets: alpaca:1.0:data/sft/train.jsonl\n"
                                                "learning_rate: .nan\n", name="args.yaml"),
         "'learning_rate'", "finite"),
    case("per_device_train_batch_size 0", sft("--per_device_train_batch_size", "0"),
         "'per_device_train_batch_size'"),
    case("max_length -1", sft("--max_length", "-1"), "'max_length'"),
    case("warmup_steps -1", sft("--warmup_steps", "-1"), "'warmup_steps'"),
    case("dataset proportion nan", sft("--train_datasets", f"alpaca:nan:{REPO}/data/sft/train.jsonl"), "nan",
         "proportion"),
    case("dataset proportion inf", sft("--train_datasets", f"alpaca:inf:{REPO}/data/sft/train.jsonl"), "inf",
         "proportion"),
    case("dataset proportion -1", sft("--train_datasets", f"alpaca:-1:{REPO}/data/sft/train.jsonl"), "-1",
         "proportion"),
    # --- the argument file itself
    case("a gzip-compressed argument file", sft_args(gzip.compress(json_args().encode())), "args.json",
         "gzip-compressed"),
    case("a non-UTF-8 argument file", sft_args(json_args().replace('"seed": 42', '"seed": 42, "x": "\udce9"')
                                               .encode("utf-8", "surrogateescape")), "args.json line", "UTF-8"),
    case("an argument file nested 100,000 deep", sft_args('{"seed": ' + "[" * DEEP + "]" * DEEP + "}"),
         "args.json line 1", "nested too deeply"),
    case("a YAML argument file nested 100,000 deep", sft_args("seed: " + "[" * DEEP + "]" * DEEP + "\n",
                                                              name="args.yaml"), "args.yaml", "nested too deeply"),
    case("a lone surrogate in the argument file", sft_args(json_args(output_dir="{out}\ud800")), "args.json line",
         "surrogate"),
    case("a YAML python tag", sft_args("seed: !!python/object/apply:os.getcwd []\n", name="args.yaml"),
         "args.yaml", "line 1"),
    case("a lone surrogate in a YAML argument file", sft_args('model_name_or_path: {model}\noutput_dir: "{out}\\ud800"'
                                                              "\n", name="args.yaml"),
         "args.yaml", "'output_dir'", "surrogate"),
    case("a UTF-16 YAML argument file", sft_args("seed: 1\n".encode("utf-16"), name="args.yaml"), "args.yaml",
         "UTF-16"),
    case("learning_rate a word", sft("--learning_rate", "fast"), "'learning_rate'", "number"),
    case("a list key given a number", sft_args(json_args(train_datasets=[5])), "'train_datasets'"),
    case("an argument file that is a named pipe", lambda t, m: (os.mkfifo(t / "args.json"), [
        "alignment/sft/run_sft.py", str(t / "args.json")])[1], "args.json", "not a regular file"),
]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_bad_data_and_argument_files(tmp_path, tiny_model_dir, capsys, case):
    run_case(case, tmp_path, tiny_model_dir, capsys)


def test_the_catalogue_names_each_case_once():
    assert len({c.id for c in CASES}) == len(CASES)


def test_what_is_valid_still_reads_the_same(tmp_path):
    """The reader's refusals stop at what is wrong: a byte-order mark, CRLF line ends, blank lines, gzip under a .gz
    name, one JSON array, pretty-printed rows, a surrogate pair, an escaped backslash before 'ud800' and a big
    integer in a column nobody reads all give the rows as written."""
    from alignment.data import RawDataset

    rows = [{"instruction": "Say hi \ud83d\ude00", "output": "a\\ud800 is not an escape", "extra": 10 ** 30},
            {"instruction": "Second", "input": "", "output": "Two"}]
    text = "\n".join(json.dumps(row) for row in rows)
    files = {"bom.jsonl": b"\xef\xbb\xbf" + text.encode(), "crlf.jsonl": text.replace("\n", "\r\n\r\n").encode(),
             "data.jsonl.gz": gzip.compress(text.encode()), "array.json": json.dumps(rows).encode(),
             "pretty.jsonl": "\n".join(json.dumps(row, indent=2) for row in rows).encode()}
    expected = [{"input": "Say hi \U0001F600", "answer": "a\\ud800 is not an escape"},
                {"input": "Second", "answer": "Two"}]
    for name, data in files.items():
        loaded = RawDataset.load("alpaca", path=write(tmp_path / name, data))
        assert [dict(loaded[i]) for i in range(len(loaded))] == expected, name
