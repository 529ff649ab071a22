"""benchmarks/results/ holds results as data: every run's JSON names its benchmark, date, commit and CPU, and the
directory keeps only the latest run of each benchmark per CPU model plus the files a documentation page names
(benchmarks/record.py: files_to_keep); older runs live in git history."""
import json
import os
import shutil
import subprocess
import sys

from benchmarks import record
from tests.helpers import REPO


def test_results_keep_only_the_latest_run_per_cpu_and_the_cited_files():
    present = set(os.listdir(record.RESULTS))
    extra = present - record.files_to_keep()
    assert not extra, f"prune with git rm (history keeps them): {sorted(extra)}"


def test_every_kept_result_records_benchmark_date_commit_and_cpu():
    for run in record.runs():
        assert run.record is not None, f"{run.files}: no JSON (benchmarks write JSON through benchmarks/record.py)"
        assert run.record.get("benchmark") == run.benchmark, run.json_name
        assert run.record.get("date"), run.json_name
        assert run.commit != "not recorded", run.json_name
        assert run.cpu is not None, f"{run.json_name}: no CPU model with family and model numbers"


def test_the_retention_rule_keeps_the_newest_run_of_each_cpu(tmp_path):
    zen4 = {"model": "AMD EPYC", "family": "25", "model_number": "17"}
    zen5 = {"model": "AMD EPYC", "family": "26", "model_number": "2"}
    files = {"bench_20261101-100000.json": zen4, "bench_20261102-100000.json": zen4,
             "bench_20261101-110000.json": zen5, "bench_20261103-090000.json": {"model": "AMD EPYC"},
             "other_20261101-100000.json": zen5}
    for name, machine in files.items():
        (tmp_path / name).write_text(json.dumps({"machine": machine, "commit": "abc1234"}))
    (tmp_path / "bench_20261102-100000.png").write_bytes(b"png")
    latest = {name for run in record.latest_per_cpu(record.runs(str(tmp_path))) for name in run.files}
    assert latest == {"bench_20261102-100000.json", "bench_20261102-100000.png", "bench_20261101-110000.json",
                      "other_20261101-100000.json"}  # a run without family / model numbers names no CPU model


def test_save_writes_the_header_beside_the_figures(tmp_path):
    path = record.save("demo", {"figure": 1.5}, str(tmp_path), when="20261201-120000")
    written = json.load(open(path))
    assert os.path.basename(path) == "demo_20261201-120000.json"
    assert written["benchmark"] == "demo" and written["date"] == "2026-12-01 12:00 UTC" and written["figure"] == 1.5
    assert written["commit"] and written["machine"]["model"] is not None
    assert [run.cpu for run in record.runs(str(tmp_path))] == [record.Run("demo", "", [], written).cpu]


def _listing(directory):
    return {name: os.stat(os.path.join(directory, name)).st_mtime_ns for name in os.listdir(directory)}


def test_a_benchmark_run_without_record_leaves_benchmarks_results_alone(tmp_path):
    """A user's run writes into the default directory (the toolkit's cache folder): benchmarks/results/, which the
    docs are built from, changes only with --record."""
    from alignment import mkl_path

    cache = tmp_path / "cache"
    cache.mkdir()
    if os.path.exists(mkl_path.cache_file()):  # the MKL path measured for this CPU: not measured again
        shutil.copy(mkl_path.cache_file(), cache / mkl_path.CACHE_FILE)
    # without our kernels: a fresh cache would build and measure them first (about a minute), and files are the point
    env = {**os.environ, "ALIGNMENT_CACHE_DIR": str(cache), "PYTHONPATH": REPO, "ALIGNMENT_CPU_KERNELS": "off"}
    before = _listing(record.RESULTS)
    done = subprocess.run([sys.executable, os.path.join(REPO, "benchmarks", "bench_update_padding.py"), "--rollouts",
                           "4", "--micro-batch", "2", "--repeats", "1"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert _listing(record.RESULTS) == before
    names = os.listdir(cache / "bench-results")
    assert len(names) == 1 and names[0].startswith("update_padding_") and names[0].endswith(".json"), names
    saved = json.load(open(cache / "bench-results" / names[0]))
    assert saved["benchmark"] == "update_padding" and "grouped by length + packed (default)" in saved["ways"]
    assert str(cache / "bench-results" / names[0]) in done.stdout  # the run says where its file went


def test_the_results_directory_follows_the_flags(tmp_path, monkeypatch):
    import argparse

    monkeypatch.setenv("ALIGNMENT_CACHE_DIR", str(tmp_path))
    parser = argparse.ArgumentParser()
    record.add_arguments(parser)
    assert record.results_dir(parser.parse_args([])) == str(tmp_path / "bench-results")
    assert record.results_dir(parser.parse_args(["--results-dir", "elsewhere"])) == "elsewhere"
    assert record.results_dir(parser.parse_args(["--record"])) == record.RESULTS
    assert record.default_results_dir() != record.RESULTS
    assert not os.path.abspath(record.default_results_dir()).startswith(REPO + os.sep)
    path = record.save("demo", {"figure": 2.0}, when="20261201-120000")
    assert path == str(tmp_path / "bench-results" / "demo_20261201-120000.json")
