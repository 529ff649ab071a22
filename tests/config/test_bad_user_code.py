"""The bad-input catalogue for user code: a user dataset module that fails to import, a dataset that fails to load
or to give a row, a row without a field the stage needs, a row too large to tokenise. Each case runs SFT or PPO
through its entry point and must exit 2 with one line naming the module / dataset / row / field, and write nothing."""
import os

import pytest

from alignment.ppo import run_ppo
from alignment.sft import run_sft
from tests.helpers import REPO

SFT_CONFIG = os.path.join(REPO, "config", "tiny", "sft_argument.json")
PPO_CONFIG = os.path.join(REPO, "config", "tiny", "ppo_argument.json")
DATASET = '''from alignment.data import RawDataset, RawSample


class Rows(RawDataset):
    NAME = "{name}"

    def __init__(self, path=None):
        {init}

    def __getitem__(self, i):
        {getitem}

    def __len__(self):
        return 4
'''
ROWS = 'self.rows = [{"q": "Say hi.", "a": "Hi!"}] * 3 + [{"q": "Say bye."}]'


def module(tmp_path, init=ROWS, getitem='return RawSample(input=self.rows[i]["q"], answer=self.rows[i]["a"])',
           source=None):
    path = tmp_path / "user_data.py"
    name = f"user-rows-{tmp_path.name}"  # a name per test: they register in one process
    path.write_text(source if source is not None else DATASET.format(name=name, init=init, getitem=getitem))
    return str(path)


CASES = [
    ("module raises on import", dict(source="import not_a_real_package_xyz\n"),
     ["user module", "user_data.py failed to import", "ModuleNotFoundError", "not_a_real_package_xyz", "line 1"]),
    ("syntax error", dict(source="def broken(:\n    pass\n"),
     ["user_data.py failed to import", "SyntaxError", "line 1"]),
    ("dataset fails to load", dict(init='raise RuntimeError("cannot open the rows")'),
     ["dataset 'user-rows'", "failed to load", "RuntimeError: cannot open the rows", "user_data.py line 8"]),
    ("row raises", dict(),
     ["dataset 'user-rows' sample 3", "KeyError: 'a'", "user_data.py line 11"]),
    ("row without a needed field", dict(getitem='return RawSample(input=self.rows[i]["q"])'),
     ["dataset 'user-rows' sample 0", "no 'answer' field", "SFT needs 'input' and 'answer'"]),
    ("row of a wrong type", dict(getitem='return RawSample(input=["a", 3], answer="x")'),
     ["dataset 'user-rows' sample 0", "'input' must be a string or a list of strings"]),
    ("row too large", dict(getitem='return RawSample(input="word " * 300_000, answer="x")'),
     ["dataset 'user-rows' sample 0", "1500001 characters of text", "at most 1000000"]),
]


@pytest.mark.parametrize("case, kwargs, fragments", CASES, ids=[c[0] for c in CASES])
def test_user_dataset_failures_are_one_line_naming_the_module_row_and_field(tmp_path, tiny_model_dir, capsys, case,
                                                                            kwargs, fragments):
    out = tmp_path / "out"
    fragments = [f.replace("user-rows", f"user-rows-{tmp_path.name}") for f in fragments]
    with pytest.raises(SystemExit) as stop:
        run_sft.main([SFT_CONFIG, "--model_name_or_path", tiny_model_dir, "--output_dir", str(out),
                      "--train_datasets", f"user-rows-{tmp_path.name}", "--eval_datasets", "", "--user_dataset_modules",
                      module(tmp_path, **kwargs), "--max_steps", "1"])
    err = capsys.readouterr().err
    assert stop.value.code == 2 and err.startswith("error: ") and err.count("\n") == 1, err
    assert [f for f in fragments if f not in err] == [], err
    assert not out.exists()


def test_a_dotted_user_module_that_is_missing_is_named(tmp_path, tiny_model_dir, capsys):
    with pytest.raises(SystemExit) as stop:
        run_sft.main([SFT_CONFIG, "--model_name_or_path", tiny_model_dir, "--output_dir", str(tmp_path / "out"),
                      "--train_datasets", "user-rows", "--user_dataset_modules", "json.no_such_module"])
    err = capsys.readouterr().err
    assert stop.value.code == 2 and "user module 'json.no_such_module' not found" in err and err.count("\n") == 1


def test_rl_prompts_without_input_are_named(tmp_path, tiny_model_dir, tiny_reward_dir, capsys):
    data = module(tmp_path, getitem='return RawSample(answer="4")')
    with pytest.raises(SystemExit) as stop:
        run_ppo.main([PPO_CONFIG, "--actor_model_name_or_path", tiny_model_dir, "--reward_model_name_or_path",
                      tiny_reward_dir, "--output_dir", str(tmp_path / "out"), "--train_datasets",
                      f"user-rows-{tmp_path.name}",
                      "--eval_datasets", "", "--user_dataset_modules", data, "--max_steps", "1"])
    err = capsys.readouterr().err
    assert stop.value.code == 2 and err.count("\n") == 1
    assert f"dataset 'user-rows-{tmp_path.name}' sample 0: no 'input' field (RL prompts need 'input'" in err
