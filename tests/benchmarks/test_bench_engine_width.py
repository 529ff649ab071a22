"""benchmarks/bench_engine_width.py with tiny settings: it writes its result through benchmarks/record.py, the
ladder and the fixed width give the same bits, the ladder ends at the rung its sequences need, and the docs' table
renders it."""
import os
import subprocess
import sys

from docsgen import results_tables
from tests.helpers import REPO, benchmark_result


def test_a_tiny_run_writes_a_result_the_docs_table_renders(tmp_path):
    result = benchmark_result("bench_engine_width.py", ["--cases", "2:8:4:60,2:100:40:400", "--repeats", "1"], tmp_path)
    assert result["benchmark"] == "engine_width" and result["machine"]["model"]
    rows = result["rows"]
    assert [(r["capacity"], r["ladder_width"]) for r in rows] == [(60, 61), (400, 192)]  # 140 columns: rung 192
    assert all(r["same_bits"] and r["speedup"] > 0 for r in rows)
    cells = results_tables.TABLES["engine_width"].rows(result)
    table = results_tables.TABLES["engine_width"]
    assert len(cells) == 2 and all(len(c) == len(table.header) for c in cells)


def test_a_case_that_does_not_fit_is_refused_in_one_line():
    out = subprocess.run([sys.executable, os.path.join(REPO, "benchmarks", "bench_engine_width.py"), "--cases",
                          "2:50:60:100", "--no-save"], capture_output=True, text=True, timeout=300, cwd=REPO)
    assert out.returncode != 0 and "Traceback" not in out.stderr
    assert "--cases 2:50:60:100: prompt + new tokens exceed the capacity" in out.stderr
