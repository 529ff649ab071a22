"""Multi-turn episodes under process layouts against one process (marked `parallel`): RLOO with the guess-number
environment from examples/ under data x tensor parallel and data x pipeline parallel trains the same as one process
on the same global batch (every row samples its episode with its own seed, so episodes do not depend on which
process plays them). Metrics within 1e-5 and final weights within 1e-5 of their largest magnitude, as
tests/parallel/test_layouts.py checks the single-turn runs."""
import os
import subprocess
import sys

import pytest

from alignment.models import LlamaForCausalLM
from tests.helpers import REPO, read_metrics
from tests.parallel.test_layouts import launch, worst_relative_difference

pytestmark = pytest.mark.parallel

LAYOUTS = {  # name: (processes, flags, data degree)
    "dp2": (2, [], 2),
    "tp2xdp2": (4, ["--tensor_parallel_degree", "2"], 2),
    "pp2xdp2": (4, ["--pipeline_parallel_degree", "2"], 2),
}
KEYS = ("actor_loss", "reward/mean", "reward/std", "kl", "entropy", "env/turns", "env/reward", "response_length")


def episode_args(tiny_model_dir, data_degree, out):
    """3 steps of RLOO: 4 prompts x 2 episodes (up to 3 turns) a step, micro-batches of 4, 2 accumulation steps."""
    return [os.path.join(REPO, "alignment", "ppo", "run_ppo.py"),
            os.path.join(REPO, "config", "tiny", "grpo_tools_argument.json"),
            "--actor_model_name_or_path", tiny_model_dir, "--output_dir", str(out), "--disable_tqdm",
            "--environment", "guess-number", "--environment_args", "{}",
            "--user_env_modules", os.path.join(REPO, "examples", "guess_number_env.py"),
            "--reward_funcs", "", "--gold_judge", "", "--eval_datasets", "", "--max_steps", "3",
            "--max_turns", "3", "--max_new_tokens", "6", "--max_length", "128", "--max_trajectory_tokens", "48",
            "--advantage_estimator", "rloo", "--num_return_sequences", "2",
            "--per_device_prompt_batch_size", str(4 // data_degree),
            "--per_device_train_batch_size", str(4 // data_degree), "--gradient_accumulation_steps", "2",
            "--adam_epsilon", "1.0", "--learning_rate", "0.02", "--logging_steps", "1"]


@pytest.fixture(scope="module")
def one_process(tiny_model_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("one-episodes") / "run"
    subprocess.run([sys.executable, *episode_args(tiny_model_dir, 1, out)], cwd=REPO, check=True,
                   capture_output=True)
    rows = [r for r in read_metrics(out) if "actor_loss" in r]
    assert len(rows) == 3 and all(r["env/turns"] > 1 for r in rows)  # really multi-turn
    # and it trained: rewards that differ between episodes, a loss off zero (step 1's on-policy RLOO loss can be 0:
    # its advantages sum to 0 per group), weights that moved (equal runs of a policy that never changed would pass
    # the comparison)
    assert all(r["reward/std"] > 0 for r in rows) and any(r["actor_loss"] != 0.0 for r in rows)
    start = LlamaForCausalLM.from_pretrained(tiny_model_dir).state_dict()
    end = LlamaForCausalLM.from_pretrained(str(out / "policy")).state_dict()
    assert max(float((start[k] - end[k]).abs().max()) for k in start) > 1e-5  # (4e-4 here: adam_epsilon 1)
    return out


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_multi_turn_layout_equals_one_process(one_process, tiny_model_dir, tmp_path, layout):
    processes, flags, data_degree = LAYOUTS[layout]
    out = tmp_path / layout
    logs = launch(tmp_path / "logs", episode_args(tiny_model_dir, data_degree, out) + flags, processes)
    assert f"world {processes} = " in logs
    metrics, weights = worst_relative_difference(one_process, out, KEYS, [("policy", LlamaForCausalLM)])
    print(f"\nmulti-turn rloo {layout}: worst relative difference: metrics {metrics:.1e}, weights {weights:.1e}")
