"""Several LoRA adapters trained in one run on one frozen base (key lora_adapters: alignment/sft/multi_adapter.py,
alignment/ppo/multi_adapter.py): each adapter's saved tensors and logged metrics are the same bits as a run of its
own with the entry's keys, in SFT and in GRPO with other reward functions per adapter; the RL policies share one
copy of the base; bad entries are one error line naming the key."""
import json
import os

import numpy as np
import pytest
from safetensors.numpy import load_file

from alignment.sft import run_sft
from tests.helpers import REPO, read_metrics

SFT_CONFIG = os.path.join(REPO, "config", "tiny", "sft_argument.json")
TRAIN, OTHER = (f"alpaca:1.0:{REPO}/data/sft/{name}.jsonl" for name in ("train", "eval"))
COMMON = ["--disable_tqdm", "--eval_datasets", "", "--max_steps", "3", "--logging_steps", "1",
          "--per_device_train_batch_size", "4", "--lora", "true", "--lora_rank", "4", "--lora_alpha", "8"]
# entries that differ in data, learning rate, seed, rank, targets and steps
ENTRIES = [{"name": "plain", "train_datasets": TRAIN, "seed": 1},
           {"name": "other-data", "train_datasets": OTHER, "learning_rate": 1e-2, "seed": 2, "lora_rank": 8,
            "lora_target_modules": ["q_proj", "v_proj"]},
           {"name": "shorter", "train_datasets": TRAIN, "seed": 3, "max_steps": 2, "lora_alpha": 16}]
FLAGS = {"train_datasets": "--train_datasets", "learning_rate": "--learning_rate", "seed": "--seed",
         "lora_rank": "--lora_rank", "lora_target_modules": "--lora_target_modules", "max_steps": "--max_steps",
         "lora_alpha": "--lora_alpha"}


def sft(model, output_dir, *extra):
    return run_sft.main([SFT_CONFIG, "--model_name_or_path", model, "--output_dir", str(output_dir), *COMMON,
                         *extra])


def alone(model, output_dir, entry):
    """A run of its own with the entry's keys."""
    flags = [part for key, value in entry.items() if key != "name"
             for part in (FLAGS[key], json.dumps(value) if isinstance(value, list) else str(value))]
    sft(model, output_dir, *flags)


def test_each_adapter_of_a_joint_run_is_the_bits_of_its_own_run(tmp_path, tiny_model_dir):
    sft(tiny_model_dir, tmp_path / "joint", "--lora_adapters", json.dumps(ENTRIES))
    trained = {}
    for entry in ENTRIES:
        alone(tiny_model_dir, tmp_path / entry["name"], entry)
        joint, own = tmp_path / "joint" / entry["name"], tmp_path / entry["name"]
        got = load_file(str(joint / "model" / "adapter_model.safetensors"))
        want = load_file(str(own / "model" / "adapter_model.safetensors"))
        assert sorted(got) == sorted(want), entry["name"]
        for key in want:
            assert np.array_equal(got[key], want[key]), (entry["name"], key)
        got_rows, want_rows = read_metrics(str(joint)), read_metrics(str(own))
        steps = entry.get("max_steps", 3)
        assert [r["step"] for r in got_rows if "loss" in r] == list(range(1, steps + 1))
        for key in ("loss", "grad_norm", "lr"):
            assert [r[key] for r in got_rows if key in r] == [r[key] for r in want_rows if key in r], key
        config = json.load(open(joint / "model" / "adapter_config.json"))
        assert config == json.load(open(own / "model" / "adapter_config.json"))
        trained[entry["name"]] = got
    a, b = trained["plain"], trained["shorter"]
    key = next(k for k in a if k.endswith("lora_B.weight"))
    assert not np.array_equal(a[key], b[key])  # the entries' seeds, data and steps did make other adapters


@pytest.mark.parametrize("entries, extra, words", [
    (ENTRIES[:1], ["--lora", "false"], "key 'lora_adapters' needs 'lora': true"),
    ([{"train_datasets": TRAIN}], [], "entry 0: missing key 'name'"),
    ([{"name": "a", "reward_funcs": ["combined"]}], [], "entry 0: 'reward_funcs' is not a key of this stage"),
    ([{"name": "a", "train_datasets": TRAIN, "lr": 1}], [], "entry 0: unknown key 'lr'"),
    ([{"name": "a", "train_datasets": TRAIN, "learning_rate": -1}], [], "key 'learning_rate' must be a positive"),
    ([{"name": "a/b", "train_datasets": TRAIN}], [], "name 'a/b' must be letters"),
    ([ENTRIES[0], ENTRIES[0]], [], "the name 'plain' is given twice"),
])
def test_bad_entries_are_one_error_line_naming_the_key(entries, extra, words, tmp_path, tiny_model_dir, capsys):
    with pytest.raises(SystemExit) as stop:
        sft(tiny_model_dir, tmp_path / "out", "--lora_adapters", json.dumps(entries), *extra)
    err = capsys.readouterr().err.strip().splitlines()
    assert stop.value.code == 2 and len(err) == 1 and "lora_adapters" in err[0] and words in err[0], err
    assert not (tmp_path / "out").exists()


def test_other_stages_refuse_the_key(tmp_path, tiny_model_dir, capsys):
    from alignment.dpo import run_dpo

    config = os.path.join(REPO, "config", "tiny", "dpo_argument.json")
    with pytest.raises(SystemExit) as stop:
        run_dpo.main([config, "--model_name_or_path", tiny_model_dir, "--output_dir", str(tmp_path / "out"),
                      "--lora", "true", "--lora_adapters", json.dumps(ENTRIES[:1]), "--max_steps", "1"])
    err = capsys.readouterr().err.strip().splitlines()
    assert stop.value.code == 2 and "this stage trains one adapter a run" in err[-1], err


GRPO_CONFIG = os.path.join(REPO, "config", "tiny", "grpo_argument.json")
RL_ENTRIES = [{"name": "cheerful", "reward_funcs": ["sentiment"], "seed": 1},
              {"name": "combined", "reward_funcs": ["combined"], "seed": 2, "learning_rate": 1e-3, "lora_rank": 8}]
RL_FLAGS = {**FLAGS, "reward_funcs": "--reward_funcs"}


def grpo(model, output_dir, *extra):
    from alignment.ppo import run_ppo

    return run_ppo.main([GRPO_CONFIG, "--actor_model_name_or_path", model, "--output_dir", str(output_dir),
                         "--disable_tqdm", "--eval_datasets", "", "--gold_judge", "", "--max_steps", "2",
                         "--num_return_sequences", "2", "--per_device_prompt_batch_size", "2",
                         "--per_device_train_batch_size", "4", "--max_new_tokens", "8", "--lora", "true",
                         "--lora_rank", "4", "--lora_alpha", "8", *extra])


def test_each_rl_adapter_with_its_own_reward_is_the_bits_of_its_own_run(tmp_path, tiny_model_dir):
    grpo(tiny_model_dir, tmp_path / "joint", "--lora_adapters", json.dumps(RL_ENTRIES))
    rewards = {}
    for entry in RL_ENTRIES:
        flags = [part for key, value in entry.items() if key != "name"
                 for part in (RL_FLAGS[key], ",".join(value) if isinstance(value, list) else str(value))]
        grpo(tiny_model_dir, tmp_path / entry["name"], *flags)
        joint, own = tmp_path / "joint" / entry["name"], tmp_path / entry["name"]
        got = load_file(str(joint / "policy" / "adapter_model.safetensors"))
        want = load_file(str(own / "policy" / "adapter_model.safetensors"))
        assert sorted(got) == sorted(want) and all(np.array_equal(got[k], want[k]) for k in want), entry["name"]
        got_rows, want_rows = read_metrics(str(joint)), read_metrics(str(own))
        for key in ("reward/mean", "loss", "kl"):
            assert [r.get(key) for r in got_rows] == [r.get(key) for r in want_rows], (entry["name"], key)
        rewards[entry["name"]] = [r["reward/mean"] for r in got_rows if "reward/mean" in r]
    assert rewards["cheerful"] != rewards["combined"]  # each adapter was scored by its own reward functions


def test_share_base_leaves_one_copy_of_the_base_and_the_same_logits(tiny_model_dir):
    import gc
    import weakref

    import paddle

    from alignment.models import LlamaForCausalLM
    from alignment.models.lora import apply_lora
    from alignment.ppo.multi_adapter import own_parameters, share_base

    first, second = (LlamaForCausalLM.from_pretrained(tiny_model_dir) for _ in range(2))
    apply_lora(first, 4, 8.0, 0.0)
    apply_lora(second, 8, 16.0, 0.0, ["q_proj", "v_proj"])
    ids = paddle.to_tensor([[5, 17, 42, 9, 300]])
    before = second(ids).logits.numpy()
    dropped = [weakref.ref(p) for name, _, attr, p in own_parameters(second) if attr not in ("lora_A", "lora_B")]
    assert share_base(second, first) == len(dropped)
    gc.collect()
    assert all(ref() is None for ref in dropped)  # the second copy of the base is gone
    base = {name: p for name, _, attr, p in own_parameters(first)}
    for name, _, attr, param in own_parameters(second):
        assert (param is base[name]) == (attr not in ("lora_A", "lora_B")), name
    assert np.array_equal(second(ids).logits.numpy(), before)
