"""benchmarks/bench_peak_memory.py measures what it says: a child that holds a known amount of touched memory is
reported at that peak (wait4's ru_maxrss, the child's own, not the parent's), a failing child stops the benchmark
with one line and a non-zero exit, a limit on the address space is applied to the child, and the docs' table
renders from a result."""
import importlib.util
import os
import subprocess
import sys

from docsgen import results_tables
from tests.helpers import REPO

BENCH = os.path.join(REPO, "benchmarks", "bench_peak_memory.py")


def bench_module():
    spec = importlib.util.spec_from_file_location("bench_peak_memory", BENCH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def holding(mib: int) -> list:
    """A Python child that writes every page of `mib` MiB (bytes * n fills them) and holds them until it exits."""
    return [sys.executable, "-c", f"held = b'x' * ({mib} << 20); print(len(held) >> 20)"]


def test_the_peak_of_a_child_is_its_touched_memory_not_the_parents(tmp_path):
    bench = bench_module()
    small = bench.run_child(holding(1), str(tmp_path / "small.log"))
    large = bench.run_child(holding(300), str(tmp_path / "large.log"))
    assert (small.exit_code, small.last_line, large.exit_code, large.last_line) == (0, "1", 0, "300")
    assert small.peak_rss_mib < 100  # an interpreter holding 1 MiB: the parent's own (pytest, paddle) is not counted
    assert 300 <= large.peak_rss_mib <= 300 + small.peak_rss_mib + 20  # what it holds, plus at most the interpreter


def test_a_child_past_its_timeout_is_killed(tmp_path):
    run = bench_module().run_child([sys.executable, "-c", "import time; time.sleep(600)"], str(tmp_path / "log"),
                                   timeout=1)
    assert run.exit_code == -9


def test_an_address_space_limit_applies_to_the_child(tmp_path):
    bench = bench_module()
    limit = bench.run_child(holding(300), str(tmp_path / "limited.log"), address_space_mib=200)
    assert limit.exit_code == 1 and limit.last_line == "MemoryError"
    check = bench.run_child([sys.executable, "-c", "import resource; print(resource.getrlimit(resource.RLIMIT_AS))"],
                            str(tmp_path / "check.log"), address_space_mib=512)
    assert check.last_line == f"({512 << 20}, {512 << 20})"


def test_a_failing_child_stops_the_benchmark_with_one_line_and_a_non_zero_exit(tmp_path):
    failing = [sys.executable, "-c", "import sys; print('working'); sys.exit('error: no such file: x.json')"]
    done = subprocess.run([sys.executable, "-c", f"""
import sys
sys.path.insert(0, {REPO!r})
from benchmarks.bench_peak_memory import measured
measured("sft", {failing!r}, {str(tmp_path / "failing.log")!r})
"""], capture_output=True, text=True, timeout=120)
    assert done.returncode != 0 and done.stdout == ""
    assert done.stderr == "error: sft exited with 1: error: no such file: x.json\n"


def test_bad_flags_are_one_line_and_exit_2():
    for flags in (["--model", "gpt5"], ["--model", "tiny", "--only", "sft,rlhf"]):
        done = subprocess.run([sys.executable, BENCH, *flags, "--no-save"], capture_output=True, text=True,
                              timeout=120)
        assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr


def test_each_entry_point_runs_its_own_program_with_the_model_set_filled_in(tmp_path):
    bench = bench_module()
    by_name = {entry.name.split()[0]: entry for entry in bench.ENTRY_POINTS}
    distill = bench.command(by_name["distill"], "smollm2", "/m", 2, "/out")
    assert distill[1:3] == [os.path.join(REPO, "alignment/ppo/run_distill.py"),
                            os.path.join(REPO, "config/smollm2/distill_chain_sum_argument.json")]
    assert distill[distill.index("--teacher_model_name_or_path") + 1] == "/m"
    assert distill[distill.index("--max_steps") + 1] == "2" and "{" not in "".join(distill)
    evaluate = bench.command(by_name["evaluate"], "tiny", "/m", 2, "/out")
    assert evaluate[1:4] == [os.path.join(REPO, "tools/evaluate.py"), "--model", "/m"]
    for entry in bench.ENTRY_POINTS:
        for model_set in bench.MODEL_SETS:
            line = bench.command(entry, model_set, "/m", 2, "/out")
            assert all(os.path.isfile(part) for part in line[1:3] if part.endswith((".py", ".json"))), line


def test_the_docs_table_renders_from_a_result():
    result = {"model_name": "tiny (tools/make_tiny.py)", "rows": [
        {"entry_point": "sft", "peak_rss_mib": 530.4, "smallest_address_space_mib": 2304},
        {"entry_point": "grpo", "peak_rss_mib": 604.0, "smallest_address_space_mib": None},
        {"entry_point": "evaluate", "peak_rss_mib": 503.6}]}
    rows = results_tables.TABLES["peak_memory"].rows(result)
    assert rows == [["sft", "tiny (tools/make_tiny.py)", "**530**", "2304 (`ulimit -v 2359296`)"],
                    ["grpo", "tiny (tools/make_tiny.py)", "**604**", "none up to 65536"],
                    ["evaluate", "tiny (tools/make_tiny.py)", "**504**", "not measured"]]
    assert len(results_tables.TABLES["peak_memory"].header) == len(rows[0])
