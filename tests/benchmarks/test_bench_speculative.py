"""benchmarks/bench_speculative.py on the tiny checkpoint with tiny settings: it runs every task, writes its
result through benchmarks/record.py, both runs give the same greedy tokens, and the docs' table renders it."""
import glob
import json
import os
import subprocess
import sys

from docsgen import results_tables
from tests.helpers import REPO


def test_a_tiny_run_writes_a_result_the_docs_table_renders(tiny_model_dir, tmp_path):
    out = subprocess.run([sys.executable, os.path.join(REPO, "benchmarks", "bench_speculative.py"), "--model",
                          tiny_model_dir, "--prompts", "2", "--batches", "1,2", "--new-tokens", "6", "--repeats", "1",
                          "--results-dir", str(tmp_path)], capture_output=True, text=True, timeout=300, cwd=REPO)
    assert out.returncode == 0, out.stderr[-2000:]
    path, = glob.glob(str(tmp_path / "speculative_*.json"))
    with open(path, encoding="utf-8") as f:
        result = json.load(f)
    assert result["benchmark"] == "speculative" and result["machine"]["model"]
    rows = result["rows"]
    assert [(r["task"], r["batch"]) for r in rows] == [(t, b) for b in (1, 2)
                                                      for t in ("repeat", "tool", "reasoning", "dialogue")]
    assert all(r["same_tokens"] and 0 < r["new_tokens"] <= 12 and r["speedup"] > 0 for r in rows)
    assert sum(r["verify_steps"] for r in rows) > 0
    cells = results_tables.TABLES["speculative"].rows(result)
    assert len(cells) == len(rows) and all(len(c) == len(results_tables.TABLES["speculative"].header) for c in cells)
