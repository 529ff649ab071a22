"""Parity with TRL (benchmarks/parity_trl.py). In the default suite, our side against TRL's numbers recorded once
from the real TRL (tests/fixtures/trl_parity.json, by tests/scripts/record_trl_parity.py, which names the TRL
version): the same rollout and weights, our update, TRL's loss and gradient norm. The online replay runs when the
peer venv is present (slow; ../shared/peers/README.md: bash setup_trl_venv.sh /tmp/trlv). Bounds, both: the
gradient norm within 1e-5 relative of TRL's for every loss type whose terms are the same; the loss within 1e-7
absolute (it is a near-cancelling mean of +-A terms: relative to it, float32 rounding alone reaches ~3e-5); the rows
whose terms differ by definition (TRL's importance-weighted KL, its sequence-level RLOO ratio off-policy) must
differ, so a silent change on either side shows."""
import os
import subprocess
import sys

import pytest

from tests.helpers import REPO

PEER = "/tmp/trlv/bin/python"
DIFFERENT_BY_DEFINITION = ("grpo b.04 k3", "dr_grpo b.04 k3", "dapo b.04 k3", "rloo")
FIXTURE = os.path.join(REPO, "tests", "fixtures", "trl_parity.json")


def check_rows(rows):
    """rows: {recipe: {loss_ours, loss_trl, rel_grad_norm}} for every recipe of parity_trl.RECIPES."""
    assert len(rows) == 11
    for name, row in rows.items():
        if name in DIFFERENT_BY_DEFINITION:
            assert row["rel_grad_norm"] > 1e-3, name
        else:
            assert row["rel_grad_norm"] < 1e-5, (name, row)
            if name != "rloo on-policy":  # TRL's value is -mean A (ratio of sums), ours -mean |y| A: both ~0 here
                assert abs(row["loss_ours"] - row["loss_trl"]) < 1e-7, (name, row)


def test_our_update_matches_the_recorded_trl_numbers(tmp_path, tiny_model_dir):
    import json

    from tests.scripts.record_trl_parity import recipe_parts, replay_weights, rollout_from_json

    import parity_trl  # benchmarks/parity_trl.py (record_trl_parity puts benchmarks/ on the path)

    record = json.load(open(FIXTURE))
    rollout = rollout_from_json(record["rollout"])
    moved = replay_weights(tiny_model_dir, rollout, str(tmp_path))
    rows = {}
    for name, entry in parity_trl.RECIPES.items():
        *_, recipe, _, on_policy = recipe_parts(entry)
        ours = parity_trl.our_step(tiny_model_dir if on_policy else moved, rollout, recipe, str(tmp_path / "o"))
        trl = record["rows"][name]
        rows[name] = {"loss_ours": ours["loss"], "loss_trl": trl["loss_trl"],
                      "rel_grad_norm": abs(ours["grad_norm"] - trl["grad_norm_trl"]) / trl["grad_norm_trl"]}
    check_rows(rows)
    assert record["trl"] == "1.12.0", "re-record with the TRL the docs name, or update them"


@pytest.mark.slow
@pytest.mark.skipif(not os.path.exists(PEER), reason="no peer venv at /tmp/trlv (../shared/peers/setup_trl_venv.sh)")
def test_the_replay_through_trl_agrees(tmp_path):
    import json

    out = subprocess.run([sys.executable, os.path.join(REPO, "benchmarks", "parity_trl.py"), "--python", PEER,
                          "--workdir", str(tmp_path)], capture_output=True, text=True, timeout=1200)
    assert out.returncode == 0, out.stderr[-2000:]
    check_rows({r["recipe"]: r for r in json.loads(out.stdout.split("RESULT ")[-1])["rows"]})


def test_a_small_shape_run_is_compared_with_the_trl_peer_line_of_its_own_cpu():
    from docsgen import results_tables

    for family, model in (("6", "207"), ("26", "2")):
        line = results_tables.peer_line("ppo", {"family": family, "model_number": model})
        assert f"family {family} model {model}" in line["session"] and line["run"] == "ppo"
    assert results_tables.peer_line("ppo", {"family": "6", "model_number": "20"}) is None  # not model 207's
    assert results_tables.peer_line("grpo", {"family": "99", "model_number": "1"}) is None
