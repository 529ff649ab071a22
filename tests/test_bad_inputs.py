"""The bad-input catalogue: malformed data files, argument files and checkpoints, each run through a real entry
point. Every case must exit non-zero with a one-line message naming the file / line / key (no traceback) and
write nothing under output_dir."""
import json
import os
import shutil

import pytest

from alignment.ppo import run_ppo
from alignment.rm import run_reward
from alignment.sft import run_sft
from tests.helpers import REPO

SFT_CONFIG = os.path.join(REPO, "config", "tiny", "sft_argument.json")
RM_CONFIG = os.path.join(REPO, "config", "tiny", "rm_argument.json")
PPO_CONFIG = os.path.join(REPO, "config", "tiny", "ppo_argument.json")
GOOD_SFT = {"instruction": "Say hi.", "input": "", "output": "Hi!"}
GOOD_PAIR = {"prompt": "Q?", "response_0": "Yes, gladly.", "response_1": "No.", "better_response_id": 0,
             "safer_response_id": 0, "is_response_0_safe": True, "is_response_1_safe": True}


def jsonl(tmp_path, rows, name="data.jsonl"):
    """A data file whose second line is `rows[1]` (a dict is dumped as JSON, str/bytes written as they are)."""
    path = tmp_path / name
    parts = [r if isinstance(r, bytes) else (r if isinstance(r, str) else json.dumps(r)).encode() for r in rows]
    path.write_bytes(b"\n".join(parts) + b"\n")
    return str(path)


def arg_file(tmp_path, base, **changes):
    data = json.load(open(base))
    data.update(changes)
    for key in [k for k, v in changes.items() if v is _DELETE]:
        del data[key]
    path = tmp_path / "args.json"
    path.write_text(json.dumps(data))
    return str(path)


_DELETE = object()


def broken_checkpoint(tmp_path, model_dir, how):
    path = tmp_path / "ckpt"
    shutil.copytree(model_dir, path)
    weights = path / "model.safetensors"
    if how == "missing weights":
        weights.unlink()
    elif how == "truncated weights":
        weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    elif how == "config mismatch":
        config = json.load(open(path / "config.json"))
        config["intermediate_size"] += 8
        (path / "config.json").write_text(json.dumps(config))
    elif how == "broken config":
        (path / "config.json").write_text('{"hidden_size": 64,')
    elif how == "missing tokenizer":
        (path / "tokenizer.json").unlink()
    return str(path)


def sft(tmp_path, model, *extra):
    return run_sft.main([SFT_CONFIG, "--model_name_or_path", model, "--output_dir", str(tmp_path / "out"),
                         "--disable_tqdm", "--eval_datasets", "", "--max_steps", "1", *extra])


def sft_data(tmp_path, model, second_row):
    return sft(tmp_path, model, "--train_datasets", f"alpaca:1.0:{jsonl(tmp_path, [GOOD_SFT, second_row])}")


def rm_data(tmp_path, model, second_row):
    return run_reward.main([RM_CONFIG, "--model_name_or_path", model, "--output_dir", str(tmp_path / "out"),
                            "--disable_tqdm", "--eval_datasets", "", "--max_steps", "1", "--train_datasets",
                            f"PKU-SafeRLHF/train:1.0:{jsonl(tmp_path, [GOOD_PAIR, second_row])}"])


def ppo(tmp_path, model, *extra):
    return run_ppo.main([PPO_CONFIG, "--actor_model_name_or_path", model, "--reward_model_name_or_path", "",
                         "--reward_funcs", "sentiment", "--output_dir", str(tmp_path / "out"), "--disable_tqdm",
                         "--eval_datasets", "", "--max_steps", "1", "--train_datasets",
                         f"prompt-only:1.0:{REPO}/data/prompts/eval.jsonl", *extra])


# (case id, how to run it (tmp_path, tiny model dir), fragments the message must contain)
CASES = [
    # --- data files
    ("broken JSON line", lambda t, m: sft_data(t, m, '{"instruction": "Hi", "output": '),
     ["data.jsonl line 2"]),
    ("missing key", lambda t, m: sft_data(t, m, {"instruction": "Hi", "input": ""}),
     ["data.jsonl line 2", "missing key 'output'"]),
    ("wrong type", lambda t, m: sft_data(t, m, {"instruction": "Hi", "input": "", "output": 42}),
     ["data.jsonl line 2", "'output' must be a string"]),
    ("empty prompt", lambda t, m: sft_data(t, m, {"instruction": "  ", "input": "", "output": "Hi"}),
     ["data.jsonl line 2", "'instruction' is empty"]),
    ("non-UTF-8 bytes", lambda t, m: sft_data(t, m, b'{"instruction": "caf\xe9", "input": "", "output": "x"}'),
     ["data.jsonl line 2", "UTF-8"]),
    ("identical answers", lambda t, m: rm_data(t, m, {**GOOD_PAIR, "response_1": "Yes, gladly."}),
     ["data.jsonl line 2", "identical"]),
    ("response id out of range", lambda t, m: rm_data(t, m, {**GOOD_PAIR, "better_response_id": 2}),
     ["data.jsonl line 2", "'better_response_id' must be 0 or 1"]),
    ("SFT data given to the reward model", lambda t, m: run_reward.main([
        RM_CONFIG, "--model_name_or_path", m, "--output_dir", str(t / "out"), "--eval_datasets", "",
        "--train_datasets", f"alpaca:1.0:{jsonl(t, [GOOD_SFT, GOOD_SFT])}"]),
     ["preference datasets need samples with 'answer', 'other_answer' and 'better'", "train_datasets"]),
    ("missing data file", lambda t, m: sft(t, m, "--train_datasets", f"alpaca:1.0:{t}/nope.jsonl"),
     ["nope.jsonl"]),
    ("unknown dataset name", lambda t, m: sft(t, m, "--train_datasets", "alpacca:1.0:data/sft/train.jsonl"),
     ["alpacca", "alpaca"]),
    ("absurdly long prompt", lambda t, m: ppo(t, m, "--train_datasets",
                                              f"prompt-only:1.0:{jsonl(t, [{'prompt': 'Hi'}, {'prompt': 'word ' * 5000}])}"),
     ["prompt 1", "key 'max_length'"]),
    # --- argument files
    ("unknown key", lambda t, m: run_sft.main([arg_file(t, SFT_CONFIG, learning_rat=1e-3, model_name_or_path=m,
                                                        output_dir=str(t / "out"))]),
     ["args.json", "unknown key 'learning_rat'", "learning_rate"]),
    ("wrong argument type", lambda t, m: sft(t, m, "--max_steps", "ten"), ["max_steps"]),
    ("contradicting values", lambda t, m: sft(t, m, "--min_learning_rate", "1.0"), ["min_learning_rate"]),
    ("missing required key", lambda t, m: run_sft.main([arg_file(t, SFT_CONFIG, train_datasets=_DELETE,
                                                                 output_dir=str(t / "out"))]),
     ["train_datasets"]),
    ("broken argument file", lambda t, m: run_sft.main([str(_write(t / "args.json", '{"seed": 1,\n  "max_steps": }'))]),
     ["args.json", "line 2"]),
    ("missing model path", lambda t, m: sft(t, f"{t}/no-such-model"), ["no-such-model"]),
    ("PPO clip_range_ratio <= 0", lambda t, m: ppo(t, m, "--clip_range_ratio", "0"), ["clip_range_ratio"]),
    ("GRPO with one sample per prompt", lambda t, m: ppo(t, m, "--advantage_estimator", "grpo",
                                                         "--num_return_sequences", "1"),
     ["num_return_sequences"]),
    ("resume from a non-checkpoint", lambda t, m: sft(t, m, "--resume_from_checkpoint", str(t)),
     ["resume_from_checkpoint", "not a complete checkpoint"]),
    # --- parallel layout (tests/test_parallel.py has the 2-process case: heads not divisible by the degree)
    ("parallel degrees do not match the world size", lambda t, m: sft(t, m, "--tensor_parallel_degree", "2"),
     ["tensor_parallel_degree 2", "world size 1"]),
    ("sharding stage2 on CPU", lambda t, m: sft(t, m, "--sharding", "stage2"), ["'sharding'", "stage2", "GPU"]),
    ("unknown offload level", lambda t, m: ppo(t, m, "--offload_level", "everything"),
     ["offload_level", "everything", "freeze_model"]),
    ("eval_mode tensor_parallel without tensor parallelism", lambda t, m: ppo(t, m, "--eval_mode", "tensor_parallel"),
     ["eval_mode", "tensor_parallel_degree > 1"]),
    # --- checkpoints
    ("missing weights", lambda t, m: sft(t, broken_checkpoint(t, m, "missing weights")),
     ["ckpt", "model.safetensors"]),
    ("truncated safetensors", lambda t, m: sft(t, broken_checkpoint(t, m, "truncated weights")),
     ["model.safetensors", "truncated or corrupt"]),
    ("config mismatch", lambda t, m: sft(t, broken_checkpoint(t, m, "config mismatch")),
     ["mlp", "shape", "model.safetensors"]),
    ("broken config.json", lambda t, m: sft(t, broken_checkpoint(t, m, "broken config")), ["config.json"]),
    ("missing tokenizer", lambda t, m: sft(t, broken_checkpoint(t, m, "missing tokenizer")), ["tokenizer"]),
]


def _write(path, text):
    path.write_text(text)
    return path


@pytest.mark.parametrize("case, run, fragments", CASES, ids=[c[0] for c in CASES])
def test_bad_input_gives_a_clear_error_and_writes_nothing(tmp_path, tiny_model_dir, capsys, case, run, fragments):
    with pytest.raises(SystemExit) as info:
        run(tmp_path, tiny_model_dir)
    err = capsys.readouterr().err.strip()
    assert info.value.code != 0, case
    assert err.startswith("error: ") and "Traceback" not in err and len(err.splitlines()) == 1, err
    for fragment in fragments:
        assert fragment in err, f"{case}: {fragment!r} not in {err!r}"
    assert not (tmp_path / "out").exists(), f"{case}: output_dir was written"


def test_the_catalogue_has_at_least_twenty_distinct_cases():
    assert len({c[0] for c in CASES}) == len(CASES) >= 20
