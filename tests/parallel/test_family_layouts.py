"""Each model family under a combined layout equals one process: RLOO (the critic-free recipe of
tests/parallel/test_layouts.py) for 3 steps on tiny Qwen3, ERNIE 4.5, Qwen3-MoE and ERNIE 4.5 MoE checkpoints (4 layers,
tied embeddings) under tensor parallelism with sharding or data parallelism and under pipeline x data parallelism, and
Qwen3 under tensor x pipeline parallelism (its tied table split over the vocabulary on the first and the last stage)
(4 processes), against the same run in one process: every logged metric and final weight within
tests/parallel/test_layouts.py's tolerances. (MoE models under tensor parallelism alone:
tests/parallel/test_moe_tensor_parallel.py.) Marked `parallel`."""
import subprocess
import sys

import pytest

from tests.helpers import REPO
from tests.training.test_family_stages import family_checkpoint
from tests.parallel.test_layouts import LAYOUTS, rl_args, rl_run_matches

pytestmark = pytest.mark.parallel

CASES = [("qwen3", "tp2xsharding2"), ("qwen3", "tp2xpp2"), ("ernie4_5", "tp2xdp2"), ("ernie4_5", "pp2xdp2"),
         ("qwen3_moe", "pp2xdp2"), ("ernie4_5_moe", "pp2xdp2"), ("qwen3_moe", "tp2xsharding2"),
         ("ernie4_5_moe", "tp2xdp2")]


@pytest.mark.parametrize("family, layout", CASES)
def test_a_family_under_a_layout_equals_one_process(family, layout, tiny_model_dir, tiny_reward_dir, tmp_path):
    actor = family_checkpoint(family, tiny_model_dir, str(tmp_path / family), num_hidden_layers=4)
    one = tmp_path / "one"
    done = subprocess.run([sys.executable, *rl_args("rloo", actor, tiny_reward_dir, 1, one)], cwd=REPO,
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    processes, flags, data_degree = LAYOUTS[layout]
    rl_run_matches(one, tmp_path, (actor, tiny_reward_dir), "rloo", layout, processes, flags, data_degree)


def test_moe_routing_replay_through_pipeline_stages_equals_one_process(tiny_model_dir, tiny_reward_dir, tmp_path):
    """RLOO on tiny Qwen3-MoE with moe_routing_replay 'rollout' and two update passes (the second routes with moved
    weights, where replay decides) under pp2 x dp2: the recorded experts travel with the hidden states from stage to
    stage and each sparse layer routes to its column, as the one-process run's actor does."""
    actor = family_checkpoint("qwen3_moe", tiny_model_dir, str(tmp_path / "qwen3_moe"), num_hidden_layers=4)
    replay = ["--moe_routing_replay", "rollout", "--update_iters", "2"]
    one = tmp_path / "one"
    done = subprocess.run([sys.executable, *rl_args("rloo", actor, tiny_reward_dir, 1, one), *replay], cwd=REPO,
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    processes, flags, data_degree = LAYOUTS["pp2xdp2"]
    rl_run_matches(one, tmp_path, (actor, tiny_reward_dir), "rloo", "pp2xdp2", processes, flags + replay,
                   data_degree)
