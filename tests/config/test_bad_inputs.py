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
    elif how == "empty config":
        (path / "config.json").write_text("{}")
    elif how == "string hidden_size":
        config = json.load(open(path / "config.json"))
        config["hidden_size"] = str(config["hidden_size"])
        (path / "config.json").write_text(json.dumps(config))
    elif how == "corrupt tokenizer":
        (path / "tokenizer.json").write_text('{"version": "1.0", "model": {"type": "BPE", "vocab": ')
    return str(path)


def reward_function(tmp_path, model, returns: str, key="--reward_funcs"):
    """A PPO run whose reward function (or gold judge) returns `returns` (Python source, `n` = completions)."""
    module = tmp_path / "my_rewards.py"
    module.write_text(f"def bad(prompts, completions, **labels):\n    n = len(completions)\n    return {returns}\n")
    extra = [key, f"{module}:bad"] + (["--reward_weights", "[1.0]"] if key == "--reward_funcs" else [])
    return ppo(tmp_path, model, *extra)


def user_dataset(tmp_path, model, sample: str):
    """A reward-model run on a user dataset (registered from a module file) whose samples are `sample`."""
    module = tmp_path / "my_data.py"
    module.write_text("from alignment.data import RawDataset\n\n\nclass Mine(RawDataset):\n    NAME = 'mine'\n\n"
                      "    def __init__(self, path=None):\n        pass\n\n    def __len__(self):\n        return 4\n\n"
                      f"    def __getitem__(self, index):\n        return {sample}\n")
    return run_reward.main([RM_CONFIG, "--model_name_or_path", model, "--output_dir", str(tmp_path / "out"),
                            "--disable_tqdm", "--eval_datasets", "", "--max_steps", "1", "--train_datasets", "mine",
                            "--user_dataset_modules", str(module)])


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
    ("hub-only dataset name offline", lambda t, m: sft(t, m, "--train_datasets", "alpaca"),
     ["Dataset 'alpaca'", "no local path given", "Pass a local path"]),
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
    # --- parallel layout (tests/parallel/test_parallel.py has the 2-process case: heads not divisible by the degree)
    ("parallel degrees do not match the world size", lambda t, m: sft(t, m, "--tensor_parallel_degree", "2"),
     ["tensor_parallel_degree 2", "world size 1"]),
    ("expert parallel degree does not divide the data ranks", lambda t, m: sft(t, m, "--expert_parallel_degree", "2"),
     ["expert_parallel_degree' 2", "data-parallel degree 1"]),
    ("expert parallelism with sharding stage2", lambda t, m: sft(t, m, "--expert_parallel_degree", "2",
                                                                 "--sharding", "stage2"),
     ["expert_parallel_degree' 2", "not built with sharding stage2/3"]),
    ("Paddle's sharding offload", lambda t, m: sft(t, m, "--sharding", "stage3 offload"),
     ["'sharding'", "stage3 offload", "remove 'offload'"]),
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
    ("empty config.json (no silent 7B defaults)", lambda t, m: sft(t, broken_checkpoint(t, m, "empty config")),
     ["config.json", "missing key 'vocab_size'", "'hidden_size'", "'num_hidden_layers'"]),
    ("hidden_size as a string", lambda t, m: sft(t, broken_checkpoint(t, m, "string hidden_size")),
     ["config.json", "'hidden_size' must be a positive integer"]),
    ("corrupt tokenizer.json", lambda t, m: sft(t, broken_checkpoint(t, m, "corrupt tokenizer")),
     ["tokenizer.json"]),
    # --- values out of range, checked before anything is built
    ("duplicate key in the argument file", lambda t, m: run_sft.main([str(_write(
        t / "args.json", f'{{"model_name_or_path": "{m}", "max_steps": 2, "max_steps": 3}}'))]),
     ["args.json", "'max_steps' is given twice"]),
    ("learning_rate inf", lambda t, m: sft(t, m, "--learning_rate", "inf"), ["'learning_rate'", "finite"]),
    ("kl_coeff NaN", lambda t, m: ppo(t, m, "--kl_coeff", "nan"), ["'kl_coeff'", "finite"]),
    ("adam_beta2 1.5", lambda t, m: sft(t, m, "--adam_beta2", "1.5"), ["'adam_beta2' must be < 1"]),
    ("temperature 1e-30", lambda t, m: ppo(t, m, "--temperature", "1e-30"), ["'temperature' must be >= 0.001"]),
    ("top_k -5", lambda t, m: ppo(t, m, "--top_k", "-5"), ["'top_k' must be >= 0, got -5"]),
    ("negative critic_learning_rate", lambda t, m: ppo(t, m, "--critic_learning_rate", "-1e-5"),
     ["'critic_learning_rate' must be > 0"]),
    ("several bad values reported at once", lambda t, m: sft(t, m, "--adam_beta2", "1.5", "--weight_decay", "-1",
                                                             "--warmup_ratio", "2"),
     ["3 problems", "'adam_beta2'", "'weight_decay'", "'warmup_ratio'"]),
    ("output_dir is a file", lambda t, m: sft(t, m, "--output_dir", str(_write(t / "a-file", "x"))),
     ["'output_dir'", "a-file is a file"]),
    ("dataset proportion 1e9", lambda t, m: sft(t, m, "--train_datasets", f"alpaca:1e9:{REPO}/data/sft/train.jsonl"),
     ["alpaca:1e+09", "at most 10,000,000"]),
    ("100k-deep nested JSON row", lambda t, m: sft_data(
        t, m, '{"instruction": "Hi", "input": "", "output": ' + "[" * 100000 + "]" * 100000 + "}"),
     ["data.jsonl line 2"]),
    ("reward function returning a dict", lambda t, m: reward_function(t, m, "{'score': 1.0}"),
     ["my_rewards.py:bad", "returned a dict", "list of numbers"]),
    ("reward function returning strings", lambda t, m: reward_function(t, m, "['good'] * n"),
     ["my_rewards.py:bad", "non-number ('good')"]),
    ("reward function returning a generator", lambda t, m: reward_function(t, m, "(1.0 for _ in range(n))"),
     ["my_rewards.py:bad", "returned a generator"]),
    ("gold judge returning NaN", lambda t, m: reward_function(t, m, "[float('nan')] * n", key="--gold_judge"),
     ["my_rewards.py:bad", "returned nan for sample 0"]),
    ("user dataset with better as a string", lambda t, m: user_dataset(
        t, m, "{'input': 'Q?', 'answer': 'Yes.', 'other_answer': 'No.', 'better': 'false'}"),
     ["dataset 'mine' sample 0", "'better' must be true or false, got 'false'"]),
]


def _write(path, text):
    path.write_text(text)
    return path


@pytest.mark.parametrize("case, run, fragments", CASES, ids=[c[0] for c in CASES])
def test_bad_input_gives_a_clear_error_and_writes_nothing(tmp_path, tiny_model_dir, capsys, case, run, fragments):
    with pytest.raises(SystemExit) as info:
        run(tmp_path, tiny_model_dir)
    err = capsys.readouterr().err.strip()
    assert info.value.code == 2, case  # the documented exit status of bad input
    assert err.startswith("error: ") and "Traceback" not in err and len(err.splitlines()) == 1, err
    for fragment in fragments:
        assert fragment in err, f"{case}: {fragment!r} not in {err!r}"
    assert not (tmp_path / "out").exists(), f"{case}: output_dir was written"


def test_the_catalogue_has_at_least_twenty_distinct_cases():
    assert len({c[0] for c in CASES}) == len(CASES) >= 20
