"""The tiny pipeline's figures are the same from one run to the next, also when another process loads the CPU
(README: "Figures a user can reproduce"). Two copies of the checkout run the smoke run as the getting-started page
shows it (its block is marked `# runnable: by tests/training/test_reproducibility.py`: run here, not a third time by
test_docs); the second with a busy-looping process beside it. Every logged metric but the timings must be equal."""
import json
import os
import shutil
import subprocess
import sys

import pytest

from docsgen import runnable
from tests.helpers import REPO

pytestmark = pytest.mark.slow
STAGES = ("tiny-sft", "tiny-rm", "tiny-ppo", "tiny-grpo", "tiny-dpo")


def copy_checkout(target):
    for folder in ("alignment", "tools", "config", "data", "examples"):
        shutil.copytree(os.path.join(REPO, folder), target / folder, ignore=shutil.ignore_patterns("__pycache__"))
    return target


def metrics(root):
    """{stage: [row without timings]} of one run."""
    out = {}
    for stage in STAGES:
        rows = [json.loads(line) for line in open(root / "outputs" / stage / "metrics.jsonl")]
        out[stage] = [{k: v for k, v in row.items() if not k.startswith("time/") and k != "tokens_per_sec"}
                      for row in rows]
    return out


def run_pipeline(root):
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH",)}
    block = runnable.block_on('getting-started/index.md', "tests/training/test_reproducibility.py")
    assert "examples/tiny_pipeline.sh" in block.script
    done = subprocess.run(["bash", "-euo", "pipefail", "-c", block.script], cwd=root, env=env, capture_output=True,
                          text=True, timeout=1200)
    assert done.returncode == 0, done.stderr[-2000:]
    return metrics(root)


def test_the_tiny_pipeline_gives_the_same_metrics_on_an_idle_and_on_a_loaded_machine(tmp_path):
    first = run_pipeline(copy_checkout(tmp_path / "a"))
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        second = run_pipeline(copy_checkout(tmp_path / "b"))
    finally:
        busy.kill()
    for stage in STAGES:
        assert len(first[stage]) > 1, stage
        assert first[stage] == second[stage], stage
