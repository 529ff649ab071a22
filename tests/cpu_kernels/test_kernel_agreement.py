"""The ranks of a job run the same kernels (alignment/cpu_kernels.agree, called as the job's groups start): two
gloo ranks told different things by ALIGNMENT_CPU_KERNELS end with one choice, the kernels both took."""
import json
import os

import pytest

from alignment.cpu_kernels import build
from tests.helpers import REPO
from tests.parallel.test_layouts import launch

pytestmark = pytest.mark.parallel
SCRIPT = os.path.join(REPO, "tests", "scripts", "kernel_choice.py")


@pytest.mark.parametrize("settings, expected", [(("on", "off"), False), (("on", "on"), True)])
def test_two_ranks_agree_on_one_choice(tmp_path, settings, expected):
    if expected and build.load_kernels() is None:
        pytest.skip(f"no kernel library on this machine ({build._state['why']})")
    launch(tmp_path / "logs", [SCRIPT, *settings, str(tmp_path)], nproc=2, timeout=600)
    ranks = [json.load(open(tmp_path / f"rank{r}.json")) for r in range(2)]
    assert ranks[0] == ranks[1] == {"token_log_probs": expected, "rms_norm": expected, "swiglu": expected,
                                    "attention_softmax": expected, "rope": expected, "decode_matmul": expected,
                                    "decode_attention": expected, "decode_layer": expected}
