"""The online replay against TRL (benchmarks/parity_trl.py) when the peer venv is present (../shared/peers/README.md:
bash setup_trl_venv.sh /tmp/trlv). Bounds: the gradient norm within 1e-5 relative of TRL's for every loss type
whose terms are the same; the loss within 1e-7 absolute (it is a near-cancelling mean of +-A terms: relative to it,
float32 rounding alone reaches ~3e-5); the rows whose terms differ by definition (TRL's importance-weighted KL,
its sequence-level RLOO ratio off-policy) must differ, so a silent change on either side shows."""
import os
import subprocess
import sys

import pytest

from tests.helpers import REPO

PEER = "/tmp/trlv/bin/python"
DIFFERENT_BY_DEFINITION = ("grpo b.04 k3", "dr_grpo b.04 k3", "dapo b.04 k3", "rloo")


@pytest.mark.slow
@pytest.mark.skipif(not os.path.exists(PEER), reason="no peer venv at /tmp/trlv (../shared/peers/setup_trl_venv.sh)")
def test_the_replay_through_trl_agrees(tmp_path):
    import json

    out = subprocess.run([sys.executable, os.path.join(REPO, "benchmarks", "parity_trl.py"), "--python", PEER,
                          "--workdir", str(tmp_path)], capture_output=True, text=True, timeout=1200)
    assert out.returncode == 0, out.stderr[-2000:]
    rows = {r["recipe"]: r for r in json.loads(out.stdout.split("RESULT ")[-1])["rows"]}
    assert len(rows) == 11
    for name, row in rows.items():
        if name in DIFFERENT_BY_DEFINITION:
            assert row["rel_grad_norm"] > 1e-3, name
        else:
            assert row["rel_grad_norm"] < 1e-5, (name, row)
            if name != "rloo on-policy":  # TRL's value is -mean A (ratio of sums), ours -mean |y| A: both ~0 here
                assert abs(row["loss_ours"] - row["loss_trl"]) < 1e-7, (name, row)
