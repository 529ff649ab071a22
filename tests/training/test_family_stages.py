"""Every stage trains every model family a step: SFT, the reward model, DPO, KTO and the RL recipes (PPO with a
critic, GRPO, RLOO, REINFORCE++, DAPO, GSPO) on tiny checkpoints of Llama 3, Qwen3, ERNIE 4.5 and the two MoE
families (tests/fixtures/models, made from transformers' classes) with the tiny tokenizer. Each run ends, logs a
finite loss, saves a model of its family that loads back and differs from where it started, and an MoE policy logs
its load-balancing loss (50 runs, ~40 s on 2 cores)."""
import json
import math
import os
import shutil

import numpy as np
import pytest
from safetensors.numpy import load_file

from alignment.dpo import run_dpo, run_kto
from alignment.ppo import run_ppo
from alignment.rm import run_reward
from alignment.sft import run_sft
from tests.helpers import REPO, read_metrics
from tests.data.test_paddlenlp_data import KTO_ROWS, write_jsonl

FAMILIES = ["llama3", "qwen3", "ernie4_5", "qwen3_moe", "ernie4_5_moe"]
STAGES = ["sft", "reward", "dpo", "kto", "ppo", "grpo", "rloo", "reinforce_plus_plus", "dapo", "gspo"]  # RL: config/tiny/<stage>_argument.json
PROMPTS = f"prompt-only:1.0:{REPO}/data/prompts/train.jsonl"
PREFERENCE = f"PKU-SafeRLHF/train:1.0:{REPO}/data/preference"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja")


def family_checkpoint(family: str, tiny_model_dir: str, path: str, **keys) -> str:
    """`family`'s tiny configuration (tests/fixtures/models) with the tiny tokenizer's vocabulary and `keys`,
    seeded random weights and that tokenizer, saved at `path`."""
    import paddle

    from alignment.models import LlamaConfig, LlamaForCausalLM

    tiny = json.load(open(os.path.join(tiny_model_dir, "config.json")))
    config = json.load(open(os.path.join(REPO, "tests", "fixtures", "models", family, "config.json")))
    config.update({key: tiny.get(key) for key in ("vocab_size", "bos_token_id", "eos_token_id", "pad_token_id")})
    config.update(keys)
    paddle.seed(5)
    LlamaForCausalLM(LlamaConfig.from_dict(config)).save_pretrained(path)
    for name in TOKENIZER_FILES:
        if os.path.exists(os.path.join(tiny_model_dir, name)):
            shutil.copy(os.path.join(tiny_model_dir, name), path)
    return path


@pytest.fixture(scope="module")
def family_dirs(tiny_model_dir, tmp_path_factory):
    root = tmp_path_factory.mktemp("families")
    return {family: family_checkpoint(family, tiny_model_dir, str(root / family)) for family in FAMILIES}


def train(stage: str, model: str, reward: str, out, tmp_path) -> str:
    """One step of `stage` on `model`; -> the directory of the model it saved."""
    common = ["--output_dir", str(out), "--disable_tqdm", "--max_steps", "1", "--save_steps", "0",
              "--logging_steps", "1"]
    if stage == "sft":
        run_sft.main([f"{REPO}/config/tiny/sft_argument.json", "--model_name_or_path", model, "--train_datasets",
                      f"alpaca:1.0:{REPO}/data/sft/train.jsonl", "--eval_datasets", "",
                      "--per_device_train_batch_size", "4", *common])
    elif stage == "reward":
        run_reward.main([f"{REPO}/config/tiny/rm_argument.json", "--model_name_or_path", model, "--train_datasets",
                         PREFERENCE, "--eval_datasets", "", "--per_device_train_batch_size", "4", *common])
    elif stage == "dpo":
        run_dpo.main([f"{REPO}/config/tiny/dpo_argument.json", "--model_name_or_path", model, "--train_datasets",
                      PREFERENCE, "--eval_datasets", "", "--per_device_train_batch_size", "4", *common])
    elif stage == "kto":
        run_kto.main([f"{REPO}/tests/fixtures/paddlenlp/kto_argument.json", "--model_name_or_path", model,
                      "--train_dataset_path", write_jsonl(tmp_path / "kto.jsonl", KTO_ROWS), "--dev_dataset_path", "",
                      "--tensor_parallel_degree", "1", *common])
    else:
        recipe = f"{REPO}/config/tiny/{stage}_argument.json"
        extra = ["--reward_model_name_or_path", reward] if stage == "ppo" else []
        run_ppo.main([recipe, "--actor_model_name_or_path", model, *extra, "--train_datasets", PROMPTS,
                      "--eval_datasets", "", "--max_new_tokens", "6", "--per_device_prompt_batch_size", "2",
                      "--per_device_train_batch_size", "2", "--num_return_sequences", "2", *common])
    saved = [os.path.dirname(p) for p in sorted(out.rglob("model.safetensors")) if "checkpoint" not in str(p)]
    assert saved, f"{stage} saved no model under {out}"
    return min(saved, key=len) if stage != "ppo" else str(out / "policy")


def check(stage: str, family: str, family_dirs, tiny_reward_dir, tmp_path):
    out = tmp_path / f"{family}-{stage}"
    saved = train(stage, family_dirs[family], tiny_reward_dir, out, tmp_path)
    rows = read_metrics(out)
    losses = [row[key] for row in rows for key in ("loss", "actor_loss") if key in row]
    assert losses and all(math.isfinite(v) for v in losses), rows
    config = json.load(open(os.path.join(saved, "config.json")))
    fixture = json.load(open(os.path.join(family_dirs[family], "config.json")))
    assert config["model_type"] == fixture["model_type"]
    start = load_file(os.path.join(family_dirs[family], "model.safetensors"))
    after = load_file(os.path.join(saved, "model.safetensors"))
    shared = [key for key in after if key in start and after[key].shape == start[key].shape]
    assert shared and any(not np.array_equal(after[key], start[key]) for key in shared)
    if family.endswith("_moe") and stage not in ("reward", "dpo", "kto"):
        assert any("moe/aux_loss" in row for row in rows)


@pytest.mark.parametrize("stage", STAGES)
@pytest.mark.parametrize("family", FAMILIES)
def test_every_stage_trains_every_family(family, stage, family_dirs, tiny_reward_dir, tmp_path):
    check(stage, family, family_dirs, tiny_reward_dir, tmp_path)
