"""Each model family under a combined layout equals one process: RLOO (the critic-free recipe of
tests/parallel/test_layouts.py) for 3 steps on tiny Qwen3, ERNIE 4.5, Qwen3-MoE and ERNIE 4.5 MoE checkpoints (4 layers,
tied embeddings) under tensor parallelism with sharding or data parallelism and under pipeline x data parallelism, and
Qwen3 under tensor x pipeline parallelism (its tied table split over the vocabulary on the first and the last stage)
(4 processes), against the same run in one process: every logged metric and final weight within
tests/parallel/test_layouts.py's tolerances. (MoE models under tensor parallelism are refused in one line.) Marked
`parallel`."""
import subprocess
import sys

import pytest

from tests.helpers import REPO
from tests.training.test_family_stages import family_checkpoint
from tests.parallel.test_layouts import LAYOUTS, rl_args, rl_run_matches

pytestmark = pytest.mark.parallel

CASES = [("qwen3", "tp2xsharding2"), ("qwen3", "tp2xpp2"), ("ernie4_5", "tp2xdp2"), ("ernie4_5", "pp2xdp2"), ("qwen3_moe", "pp2xdp2"),
         ("ernie4_5_moe", "pp2xdp2")]


@pytest.mark.parametrize("family, layout", CASES)
def test_a_family_under_a_layout_equals_one_process(family, layout, tiny_model_dir, tiny_reward_dir, tmp_path):
    actor = family_checkpoint(family, tiny_model_dir, str(tmp_path / family), num_hidden_layers=4)
    one = tmp_path / "one"
    done = subprocess.run([sys.executable, *rl_args("rloo", actor, tiny_reward_dir, 1, one)], cwd=REPO,
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    processes, flags, data_degree = LAYOUTS[layout]
    rl_run_matches(one, tmp_path, (actor, tiny_reward_dir), "rloo", layout, processes, flags, data_degree)
