"""Raw data layer: registry, user modules, specs, mixing, built-in loaders, errors, demo data."""
import filecmp
import gzip
import json
import subprocess
import sys
from pathlib import Path

import datasets
import pytest

from alignment.config.registry import DATASETS
from alignment.data import (
    DataFormatError,
    DatasetSpec,
    MixedRawDataset,
    MixSource,
    RawDataset,
    import_user_module,
    import_user_modules,
    parse_dataset_specs,
    split_hh_rlhf_transcript,
)

REPO = Path(__file__).resolve().parents[2]
DATA = REPO / "data"


pytestmark = pytest.mark.usefixtures("offline_datasets")


@pytest.fixture
def registry():
    saved = dict(DATASETS.classes)
    yield RawDataset
    DATASETS.classes.clear()
    DATASETS.classes.update(saved)


@pytest.fixture
def counting(registry):
    class Counting(RawDataset):
        NAME = "test-counting"

        def __init__(self, path=None):
            self.size = int(path or 10)

        def __getitem__(self, index):
            if not 0 <= index < self.size:
                raise IndexError(index)
            return {"input": f"q{index}"}

        def __len__(self):
            return self.size

    return Counting


def write_lines(path: Path, lines) -> str:
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return str(path)


def pku_row(**overrides):
    row = {"prompt": "What is 2 + 2?", "response_0": "4", "response_1": "5", "better_response_id": 0,
           "safer_response_id": 1, "is_response_0_safe": True, "is_response_1_safe": False}
    row.update(overrides)
    return {key: value for key, value in row.items() if value is not ...}


def pku_file(tmp_path, rows, name="pku.jsonl") -> str:
    return write_lines(tmp_path / name, [json.dumps(row) for row in rows])


# --------------------------------------------------------------------------- registry


def test_subclass_with_name_and_aliases_registers(counting):
    class Toy(counting):
        NAME = "test-toy"
        ALIASES = ("test-toy/train", "test-toy-alias")

    for name in ("test-toy", "test-toy/train", "test-toy-alias"):
        dataset = RawDataset.load(name, path="3")
        assert type(dataset) is Toy and len(dataset) == 3
        assert list(dataset) == [{"input": "q0"}, {"input": "q1"}, {"input": "q2"}]


def test_base_class_without_name_does_not_register(registry):
    before = set(registry.registered_names())

    class Helper(RawDataset):
        pass

    assert set(registry.registered_names()) == before


def test_duplicate_name_or_alias_raises(counting):
    with pytest.raises(ValueError, match="'test-counting' is already registered by .*Counting"):
        class Other(RawDataset):
            NAME = "test-counting"
    with pytest.raises(ValueError, match="'alpaca' is already registered"):
        class Clash(RawDataset):
            NAME = "test-clash"
            ALIASES = ("alpaca",)
    assert "test-clash" not in RawDataset.registered_names()  # nothing half-registered
    with pytest.raises(ValueError, match="may not contain"):
        class Colon(RawDataset):
            NAME = "bad:name"


def test_unknown_name_lists_registered_names_sorted(counting):
    with pytest.raises(ValueError) as info:
        RawDataset.load("no-such-data")
    names = RawDataset.registered_names()
    assert names == sorted(names) and "test-counting" in names and "PKU-SafeRLHF/train" in names
    assert str(info.value).startswith(f"Unknown dataset 'no-such-data': no registered name and no such file. "
                                      f"Registered: {', '.join(names)}; ")
    assert "RawDataset subclass with a NAME in a user_dataset_modules file" in str(info.value)  # how to add one


def test_user_module_file_registers_dataset(registry, tmp_path):
    (tmp_path / "my_datasets.py").write_text(
        "from alignment.data import RawDataset, RawSample\n\n"
        "class Lines(RawDataset):\n"
        "    NAME = 'test-user-lines'\n"
        "    def __init__(self, path=None):\n"
        "        self.lines = open(path, encoding='utf-8').read().split()\n"
        "    def __getitem__(self, index):\n"
        "        return RawSample(input=self.lines[index])\n"
        "    def __len__(self):\n"
        "        return len(self.lines)\n"
    )
    data = write_lines(tmp_path / "words.txt", ["alpha", "beta"])
    module = import_user_module("my_datasets.py", base_dir=tmp_path)
    assert import_user_module(tmp_path / "my_datasets.py") is module  # second import: same module
    assert [s["input"] for s in RawDataset.load("test-user-lines", path=data)] == ["alpha", "beta"]
    assert MixedRawDataset(f"test-user-lines:2:{data}").sources[0].selected == 4


def test_user_module_by_dotted_name_and_missing_file(registry, tmp_path, monkeypatch):
    (tmp_path / "user_ds_pkg_mod.py").write_text(
        "from alignment.data import RawDataset\nclass D(RawDataset):\n    NAME = 'test-dotted'\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    import_user_modules(["user_ds_pkg_mod"])
    assert "test-dotted" in RawDataset.registered_names()
    with pytest.raises(FileNotFoundError, match="'nope.py' not found .*nope.py"):
        import_user_module("nope.py", base_dir=tmp_path)


# --------------------------------------------------------------------------- specs


@pytest.mark.parametrize("specs, expected", [
    ("alpaca", [DatasetSpec("alpaca", 1.0, None)]),
    ("alpaca:0.5", [DatasetSpec("alpaca", 0.5, None)]),
    ("alpaca:2:data/sft/train.jsonl", [DatasetSpec("alpaca", 2.0, "data/sft/train.jsonl")]),
    ("jsonl:1:C:\\data\\x.jsonl", [DatasetSpec("jsonl", 1.0, "C:\\data\\x.jsonl")]),
    ("a:0.5, b:2:p.jsonl", [DatasetSpec("a", 0.5), DatasetSpec("b", 2.0, "p.jsonl")]),
    (["a", "b:3:p", DatasetSpec("c"), {"name": "d", "proportion": 0.25}, "e:2,f"],
     [DatasetSpec("a"), DatasetSpec("b", 3.0, "p"), DatasetSpec("c"), DatasetSpec("d", 0.25), DatasetSpec("e", 2.0),
      DatasetSpec("f")]),
    ({"a": 0.5, "b": {"proportion": 2, "path": "p"}, "c": None, "d": {"path": "q"}},
     [DatasetSpec("a", 0.5), DatasetSpec("b", 2.0, "p"), DatasetSpec("c"), DatasetSpec("d", 1.0, "q")]),
    (DatasetSpec("x", 1.5), [DatasetSpec("x", 1.5)]),
])
def test_parse_dataset_specs(specs, expected):
    assert parse_dataset_specs(specs) == expected


@pytest.mark.parametrize("specs, fragment", [
    ("", "empty entry"), ("a,,b", "empty entry"), (":1", "':1': empty dataset name"),
    ("a:", "'a:': proportion '' is not a number"), ("a:x", "'a:x': proportion 'x' is not a number"),
    ("a:0", "'a:0': proportion must be > 0"), ("a:-1", "proportion must be > 0"), ("a:nan", "'a:nan'"),
    ("a:1:", "'a:1:': empty path"), ({"a": "x"}, "proportion 'x'"), ({"a": True}, "not a number"),
    ({"a": {"weight": 1}}, "unknown keys ['weight']"), ([3], "Invalid dataset spec 3"), (5, "expected a string"),
    ([], "no dataset given"), (["a", ""], "empty entry"),
])
def test_parse_dataset_specs_errors(specs, fragment):
    with pytest.raises(ValueError, match="Invalid dataset spec") as info:
        parse_dataset_specs(specs)
    assert fragment in str(info.value)
    with pytest.raises(ValueError, match="'x:0': proportion must be > 0"):
        DatasetSpec("x", 0)


# --------------------------------------------------------------------------- mixing


def test_mix_subsample_and_oversample_counts(counting):
    half = MixedRawDataset("test-counting:0.5:10", seed=1)
    inputs = [sample["input"] for sample in half]
    assert len(half) == 5 and len(set(inputs)) == 5
    assert inputs == sorted(inputs, key=lambda text: int(text[1:]))  # original order kept
    double = MixedRawDataset("test-counting:2.0:10")
    assert len(double) == 20 and all([s["input"] for s in double].count(f"q{i}") == 2 for i in range(10))
    partial = [s["input"] for s in MixedRawDataset("test-counting:1.5:10")]
    assert len(partial) == 15 and partial[:10] == [f"q{i}" for i in range(10)] and len(set(partial[10:])) == 5


def test_mix_is_deterministic_and_reports_sources(counting):
    specs = ["test-counting:0.5:10", "test-counting:1.25:4"]
    first, again, other = MixedRawDataset(specs, seed=3), MixedRawDataset(specs, seed=3), MixedRawDataset(specs, seed=4)
    assert list(first) == list(again) and list(first) != list(other)
    assert first.sources == [MixSource("test-counting", "10", 0.5, 10, 5), MixSource("test-counting", "4", 1.25, 4, 5)]
    assert len(first) == 10 and first[9]["input"] in {"q0", "q1", "q2", "q3"}
    with pytest.raises(ValueError, match="selects no samples"):
        MixedRawDataset("test-counting:0.01:10")


def test_mix_shipped_files():
    mixed = MixedRawDataset({"alpaca": {"proportion": 0.5, "path": str(DATA / "sft/train.jsonl")},
                             "prompt-only": {"proportion": 2, "path": str(DATA / "prompts/eval.jsonl")}})
    assert [source.selected for source in mixed.sources] == [300, 80] and len(mixed) == 380


# --------------------------------------------------------------------------- built-in loaders


def test_pku_saferlhf_rows_and_directory_splits(tmp_path):
    write_lines(tmp_path / "train.jsonl", [json.dumps(pku_row()), json.dumps(pku_row(
        better_response_id=1, safer_response_id=0, is_response_0_safe=False, is_response_1_safe=True))])
    write_lines(tmp_path / "test.jsonl", [json.dumps(pku_row(prompt="Test?"))])
    train = RawDataset.load("PKU-SafeRLHF/train", path=tmp_path)
    assert train[0] == {"input": "What is 2 + 2?", "answer": "4", "other_answer": "5", "better": True,
                        "safer": False, "is_safe": True, "is_other_safe": False}
    flags = ("better", "safer", "is_safe", "is_other_safe")
    assert [train[1][flag] for flag in flags] == [False, True, False, True]
    assert [s["input"] for s in RawDataset.load("PKU-SafeRLHF/test", path=tmp_path)] == ["Test?"]
    for name in ("PKU-SafeRLHF", "PKU-SafeRLHF-30K/train", "PKU-SafeRLHF-30K/test", "PKU-SafeRLHF-10K/train"):
        assert len(RawDataset.load(name, path=tmp_path / "train.jsonl")) == 2


def test_directory_with_split_files_below(tmp_path):
    for sub in ("model-a", "model-b"):
        (tmp_path / "data" / sub).mkdir(parents=True)
        pku_file(tmp_path / "data" / sub, [pku_row(prompt=sub)], "train.jsonl")
    with gzip.open(tmp_path / "data" / "model-b" / "test.jsonl.gz", "wt") as handle:
        handle.write(json.dumps(pku_row(prompt="zipped")) + "\n" + json.dumps(pku_row(prompt="")) + "\n")
    assert [s["input"] for s in RawDataset.load("PKU-SafeRLHF", path=tmp_path)] == ["model-a", "model-b"]
    with pytest.raises(DataFormatError, match=r"test.jsonl.gz line 2: 'prompt' is empty"):
        RawDataset.load("PKU-SafeRLHF/test", path=tmp_path)


def test_hub_loading_without_path(monkeypatch):
    calls = []

    def fake_load_dataset(name, split, **kwargs):
        calls.append((name, split, kwargs))
        return datasets.Dataset.from_list([pku_row(), pku_row(response_1="4")])

    monkeypatch.setattr(datasets, "load_dataset", fake_load_dataset)
    with pytest.raises(DataFormatError, match=r"^PKU-Alignment/PKU-SafeRLHF-30K \(test\) row index 1: response_0 and"):
        RawDataset.load("PKU-SafeRLHF-30K/test", revision="main")
    assert calls == [("PKU-Alignment/PKU-SafeRLHF-30K", "test", {"revision": "main"})]
    expected = r"skipped 2 invalid row.*Anthropic/hh-rlhf \(test\) row index 0: missing key 'chosen'"
    with pytest.warns(UserWarning, match=expected):
        assert len(RawDataset.load("hh-rlhf/test", strict=False)) == 0
    with pytest.raises(ValueError, match="'jsonl' needs a local path"):
        RawDataset.load("jsonl")


def test_hh_rlhf_multi_turn_split(tmp_path):
    prefix = ("\n\nHuman: Can you help me plan a picnic?\n\nAssistant: Sure! Where would you like to go?"
              "\n\nHuman: A park near the river.")
    chosen = prefix + "\n\nAssistant: Great choice. Bring a blanket and some sandwiches."
    rejected = prefix + "\n\nAssistant: No."
    path = write_lines(tmp_path / "hh.jsonl", [json.dumps({"chosen": chosen, "rejected": rejected})])
    [sample] = list(RawDataset.load("hh-rlhf", path=path))
    assert sample == {"input": ["Can you help me plan a picnic?", "Sure! Where would you like to go?",
                                "A park near the river."],
                      "answer": "Great choice. Bring a blanket and some sandwiches.", "other_answer": "No.",
                      "better": True}
    assert split_hh_rlhf_transcript("Human: Hi\n\nAssistant: Hello") == (["Hi"], "Hello")
    for broken in ("Hello\n\nHuman: Hi\n\nAssistant: Yo", "\n\nHuman: Hi", "\n\nHuman: A\n\nHuman: B\n\nAssistant: C"):
        with pytest.raises(ValueError):
            split_hh_rlhf_transcript(broken)


def test_alpaca_and_generic_json(tmp_path):
    alpaca = write_lines(tmp_path / "alpaca.jsonl", [
        json.dumps({"instruction": "Add.", "input": "2 and 3", "output": "5"}),
        json.dumps({"instruction": "Say hi.", "input": "", "output": "Hi!"})])
    assert list(RawDataset.load("alpaca", path=alpaca)) == [{"input": "Add.\n\n2 and 3", "answer": "5"},
                                                             {"input": "Say hi.", "answer": "Hi!"}]
    generic = tmp_path / "rows.json"  # a JSON array file
    generic.write_text(json.dumps([
        {"prompt": "P1"}, {"prompt": "P2", "answer": "A2"}, {"instruction": "I", "input": "x", "output": "O"},
        {"input": ["u1", "a1", "u2"], "response": "R"}, {"dialogue": ["u", "a", "u2", "a2"]},
        {"prompt": "P", "answer": ""}],
        indent=1))
    assert list(RawDataset.load("prompt-only", path=generic)) == [
        {"input": "P1"}, {"input": "P2", "answer": "A2"}, {"input": "I\n\nx", "answer": "O"},
        {"input": ["u1", "a1", "u2"], "answer": "R"},
        {"input": ["u", "a", "u2"], "answer": "a2", "dialogue": ["u", "a", "u2", "a2"]}, {"input": "P"}]


@pytest.mark.parametrize("name, relative, count", [
    ("alpaca", "sft/train.jsonl", 600), ("alpaca", "sft/eval.jsonl", 60),
    ("prompt-only", "prompts/train.jsonl", 160), ("prompt-only", "prompts/eval.jsonl", 40),
    ("PKU-SafeRLHF/train", "preference", 400), ("PKU-SafeRLHF/test", "preference", 60),
    ("hh-rlhf", "hh_rlhf_sample", 50),
])
def test_shipped_data_loads(name, relative, count, capfd):
    samples = list(RawDataset.load(name, path=DATA / relative))
    assert len(samples) == count and all(sample["input"] for sample in samples)
    if name.startswith("PKU"):
        assert {s["better"] for s in samples} == {True, False}
        assert all(s["answer"] != s["other_answer"] for s in samples)
    if name == "hh-rlhf":
        assert any(len(s["input"]) > 1 for s in samples) and any(len(s["input"]) == 1 for s in samples)
    assert "Generating" not in capfd.readouterr().err  # no progress bars for local files


def test_demo_data_generator_reproduces_committed_files(tmp_path):
    out = tmp_path / "out"
    subprocess.run([sys.executable, str(REPO / "tools/make_demo_data.py"), "--out", str(out)],
                   check=True, capture_output=True)
    files = sorted(str(p.relative_to(out)) for p in out.rglob("*") if p.is_file())
    assert len(files) == 8  # 7 jsonl files + README.md; data/ may hold further, hand-made files
    _, mismatch, errors = filecmp.cmpfiles(DATA, out, files, shallow=False)
    assert mismatch == [] and errors == []


# --------------------------------------------------------------------------- errors name file and line


@pytest.mark.parametrize("lines, message", [
    ([json.dumps(pku_row()), "", '{"prompt": "x", "response_0": "a"', json.dumps(pku_row())],
     "line 3: invalid JSON: Expecting ',' delimiter"),
    ([json.dumps(pku_row()), "", "  ", "", "", "", json.dumps(pku_row(response_1=...))],
     "line 7: missing key 'response_1' (PKU-SafeRLHF rows need prompt, response_0, response_1,"),
    ([json.dumps(pku_row()), json.dumps(pku_row(response_1=None))], "line 2: key 'response_1' is null"),
    ([json.dumps(pku_row()), json.dumps(pku_row(better_response_id="x"))],
     "line 2: 'better_response_id' must be 0 or 1, got 'x'"),
    ([json.dumps(pku_row()), "", json.dumps(pku_row(better_response_id="x")), ""],  # datasets fails here
     "line 3: 'better_response_id' must be 0 or 1, got 'x'"),
    ([json.dumps(pku_row(better_response_id=2))], "line 1: 'better_response_id' must be 0 or 1, got 2"),
    ([json.dumps(pku_row(is_response_0_safe=1))], "line 1: 'is_response_0_safe' must be true or false, got 1"),
    ([json.dumps(pku_row(prompt=5))], "line 1: 'prompt' must be a string, got a number 5"),
    ([json.dumps(pku_row()), json.dumps(pku_row(prompt="  "))], "line 2: 'prompt' is empty"),
    ([json.dumps(pku_row()), "", json.dumps(pku_row(response_1="4 "))],
     "line 3: response_0 and response_1 are identical"),
    ([json.dumps(pku_row()), "[1, 2]"], "line 2: expected a JSON object, got an array"),
])
def test_pku_errors_name_file_and_line(tmp_path, lines, message):
    path = write_lines(tmp_path / "bad.jsonl", lines)
    with pytest.raises(DataFormatError) as info:
        RawDataset.load("PKU-SafeRLHF/train", path=path)
    assert str(info.value).startswith(f"{path} {message}")
    assert info.value.path == path and info.value.line == int(message.split()[1].rstrip(":"))


def test_non_utf8_bytes_name_the_line(tmp_path):
    path = tmp_path / "latin1.jsonl"
    path.write_bytes(json.dumps(pku_row()).encode() + b"\n" + json.dumps(pku_row(prompt="caf\u00e9")).encode("latin-1")
                     .replace(b"\\u00e9", b"\xe9") + b"\n")
    with pytest.raises(DataFormatError, match=r"latin1.jsonl line 2: not valid UTF-8 \(byte 0xe9 at column 16\)"):
        RawDataset.load("PKU-SafeRLHF", path=path)


def test_other_format_errors(tmp_path):
    array = tmp_path / "array.json"
    array.write_text(json.dumps([{"prompt": "ok"}, {"prompt": ""}], indent=2))
    with pytest.raises(DataFormatError, match=r"array.json line 5: 'prompt' is empty"):
        RawDataset.load("jsonl", path=array)
    hh = write_lines(tmp_path / "hh.jsonl", [json.dumps({"chosen": "\n\nHuman: Hi\n\nAssistant: A",
                                                           "rejected": "Human: Hi"})])
    with pytest.raises(DataFormatError, match=r"hh.jsonl line 1: 'rejected': transcript must start with 'Human:'"):
        RawDataset.load("hh-rlhf", path=hh)
    alpaca = write_lines(tmp_path / "alpaca.jsonl", [json.dumps({"instruction": "A", "input": ["x"], "output": "5"})])
    with pytest.raises(DataFormatError, match=r"line 1: 'input' must be a string, got an array \[\"x\"\]"):
        RawDataset.load("alpaca", path=alpaca)
    mixed = pku_file(tmp_path, [pku_row(extra=1), pku_row(response_1="6"), pku_row(extra="s")], "mixed.jsonl")
    assert len(RawDataset.load("PKU-SafeRLHF", path=mixed)) == 3  # an unread column may change type
    typed = pku_file(tmp_path, [pku_row(), pku_row(better_response_id="1")], "typed.jsonl")
    with pytest.raises(DataFormatError, match="typed.jsonl line 2: 'better_response_id' must be 0 or 1, got '1'"):
        RawDataset.load("PKU-SafeRLHF", path=typed)  # a typed field as a string is refused, not cast
    empty = write_lines(tmp_path / "empty.jsonl", [])
    with pytest.raises(DataFormatError, match="empty.jsonl: the file has no rows"):
        RawDataset.load("jsonl", path=empty)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        RawDataset.load("alpaca", path=tmp_path / "missing.jsonl")
    with pytest.raises(FileNotFoundError, match="No 'test' data file"):
        RawDataset.load("PKU-SafeRLHF/test", path=tmp_path)


def test_non_strict_skips_invalid_rows_with_warning(tmp_path):
    path = pku_file(tmp_path, [pku_row(), pku_row(response_1="4"), pku_row(prompt="")])
    with pytest.warns(UserWarning, match=r"skipped 2 invalid row\(s\); first: .*line 2: response_0 and"):
        dataset = RawDataset.load("PKU-SafeRLHF/train", path=path, strict=False)
    assert len(dataset) == 1 and dataset.skipped == 2


def test_a_relative_user_module_path_is_found_beside_the_argument_file(tmp_path, monkeypatch):
    from alignment.data import import_user_modules

    (tmp_path / "cfg").mkdir()
    (tmp_path / "cfg" / "beside.py").write_text(
        "from alignment.data import RawDataset\n\n\nclass Beside(RawDataset):\n    NAME = 'beside-args-file'\n\n"
        "    def __getitem__(self, i):\n        return {'input': 'q', 'answer': 'a'}\n\n"
        "    def __len__(self):\n        return 1\n")
    monkeypatch.chdir(tmp_path)  # the working directory has no beside.py
    (module,) = import_user_modules(["beside.py"], base_dir=str(tmp_path / "cfg"))
    assert module.Beside.NAME == "beside-args-file"
    with pytest.raises(FileNotFoundError, match="looked for .*cfg/other.py and .*other.py"):
        import_user_modules(["other.py"], base_dir=str(tmp_path / "cfg"))


def test_starting_a_stage_does_not_import_datasets():
    """`datasets` costs over a second of every process start (each rank of a launch): only a hub download loads it."""
    code = ("import sys; import alignment.ppo.run_ppo, alignment.sft.run_sft, alignment.dpo.run_dpo, "
            "alignment.dpo.run_kto, alignment.rm.run_reward; print('datasets' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=str(REPO))
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == "False"
