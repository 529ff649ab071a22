"""benchmarks/results/ holds results as data: every run's JSON names its benchmark, date, commit and CPU, and the
directory keeps only the latest run of each benchmark per CPU model plus the files a documentation page names
(benchmarks/record.py: files_to_keep); older runs live in git history."""
import json
import os

from benchmarks import record


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
