"""MKL's code path on AMD chosen by measurement and kept per CPU (alignment/mkl_path.py, alignment/cpu_env.py)."""
import json
import os
import subprocess
import sys

import pytest

from alignment import cpu_env, mkl_path

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
AVX512 = "fpu avx avx2 fma avx512f avx512cd avx512bw avx512dq avx512vl avx512_bf16"
ZEN4 = {"vendor_id": "AuthenticAMD", "cpu family": "25", "model": "17", "model name": "AMD EPYC", "flags": AVX512}
ZEN5 = {**ZEN4, "cpu family": "26", "model": "2"}
XEON = {"vendor_id": "GenuineIntel", "cpu family": "6", "model": "143", "flags": AVX512}


def test_only_amd_cpus_choose_and_only_among_paths_whose_instructions_they_have():
    assert mkl_path.possible_paths(ZEN4) == mkl_path.possible_paths(ZEN5) == ["7", "5"]  # the family decides nothing
    assert mkl_path.possible_paths({**ZEN5, "flags": AVX512.replace("avx512dq ", "")}) == ["5"]  # 7 would SIGILL
    assert mkl_path.possible_paths({**ZEN5, "flags": "fpu sse2 avx"}) == []  # MKL's generic code
    assert mkl_path.possible_paths(XEON) == [] and mkl_path.possible_paths({}) == []  # MKL dispatches itself


def test_the_faster_path_is_the_higher_geometric_mean_over_the_shapes_both_ran():
    # 7: sqrt(400 * 25) = 100; 5: sqrt(100 * 110) = 104.9: 7 wins one shape by 4x and still loses
    figures = {"7": {"decode": 400.0, "train": 25.0, "only7": 1e6}, "5": {"decode": 100.0, "train": 110.0}}
    assert mkl_path.faster(figures) == "5"
    figures["5"]["train"] = 99.0  # sqrt(100 * 99) = 99.5 < 100
    assert mkl_path.faster(figures) == "7"
    assert mkl_path.faster({"5": {"decode": 1.0}}) == "5"


class FakeMeasure:
    def __init__(self, figures):
        self.figures, self.calls = figures, []

    def __call__(self, paths):
        self.calls.append(list(paths))
        return {p: f for p, f in self.figures.items() if p in paths}


FIGURES = {"7": {"decode": 200.0, "train": 210.0}, "5": {"decode": 90.0, "train": 105.0}}


def test_a_measured_choice_is_kept_per_cpu_and_measured_again_only_when_asked_or_unusable(tmp_path, monkeypatch):
    monkeypatch.setenv("ALIGNMENT_CACHE_DIR", str(tmp_path))
    measure = FakeMeasure(FIGURES)
    assert mkl_path.measured_choice(ZEN4, ["7", "5"], measure_paths=measure) == "7"
    assert mkl_path.measured_choice(ZEN4, ["7", "5"], measure_paths=measure) == "7"
    assert len(measure.calls) == 1  # the second start read the file
    entries = json.loads((tmp_path / "mkl_paths.json").read_text())
    entry = entries[mkl_path.cpu_key(ZEN4)]
    assert entry["path"] == "7" and entry["gflops"] == FIGURES and entry["cpu"] == "AMD EPYC"
    assert "family 25 model 17" in mkl_path.cpu_key(ZEN4) and "paddle " in mkl_path.cpu_key(ZEN4)
    assert mkl_path.cpu_key({**ZEN4, "flags": AVX512 + " vaes"}) != mkl_path.cpu_key(ZEN4)  # another VM's flags

    slow7 = FakeMeasure({"7": {"decode": 50.0, "train": 60.0}, "5": FIGURES["5"]})
    assert mkl_path.measured_choice(ZEN5, ["7", "5"], measure_paths=slow7) == "5"  # another CPU, its own entry
    assert mkl_path.measured_choice(ZEN4, ["7", "5"], measure_paths=slow7) == "7" and len(slow7.calls) == 1
    assert mkl_path.measured_choice(ZEN4, ["7", "5"], remeasure=True, measure_paths=slow7) == "5"
    assert len(slow7.calls) == 2 and set(json.loads((tmp_path / "mkl_paths.json").read_text())) == {
        mkl_path.cpu_key(ZEN4), mkl_path.cpu_key(ZEN5)}

    (tmp_path / "mkl_paths.json").write_text("{not json")  # a damaged file is measured again and rewritten
    assert mkl_path.measured_choice(ZEN4, ["7", "5"], measure_paths=measure) == "7" and len(measure.calls) == 2
    assert json.loads((tmp_path / "mkl_paths.json").read_text())[mkl_path.cpu_key(ZEN4)]["path"] == "7"
    assert [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")] == []


@pytest.mark.parametrize("probe", ["import sys; sys.exit(132)",  # dies, as of SIGILL
                                   "print('no figures')", "print('{\"decode 8x576x1536\": 1.0}')",  # one shape
                                   "import time; time.sleep(5)"])  # hangs past the timeout
def test_no_figures_give_the_avx2_path_and_keep_nothing(tmp_path, monkeypatch, probe):
    monkeypatch.setenv("ALIGNMENT_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(mkl_path, "PROBE", probe)
    monkeypatch.setattr(mkl_path, "PROBE_TIMEOUT", 1.0)
    if mkl_path.mkl_library_dir() is not None:
        assert mkl_path.measure(["7", "5"], rounds=1) == {}
    assert mkl_path.measured_choice(ZEN4, ["7", "5"]) == "5"
    assert mkl_path.read_cache(str(tmp_path / "mkl_paths.json")) == {}  # the next start tries again


def test_an_unwritable_cache_directory_still_chooses(tmp_path, monkeypatch):
    blocker = tmp_path / "file"
    blocker.write_text("")
    monkeypatch.setenv("ALIGNMENT_CACHE_DIR", str(blocker / "under-a-file"))
    assert mkl_path.measured_choice(ZEN4, ["7", "5"], measure_paths=FakeMeasure(FIGURES)) == "7"


def test_cpu_defaults_set_the_chosen_path_and_ask_only_when_there_is_a_choice():
    asked = []

    def choose(cpu, paths):
        asked.append(paths)
        return "7"

    assert cpu_env.cpu_defaults(ZEN4, 2, choose)["MKL_DEBUG_CPU_TYPE"] == "7"
    assert cpu_env.cpu_defaults({**ZEN4, "flags": "avx avx2 fma"}, 2, choose)["MKL_DEBUG_CPU_TYPE"] == "5"
    assert "MKL_DEBUG_CPU_TYPE" not in cpu_env.cpu_defaults(XEON, 2, choose)
    assert asked == [["7", "5"]]


@pytest.mark.skipif(mkl_path.mkl_library_dir() is None, reason="Paddle's CPU wheel (libmklml_intel.so) not installed")
def test_the_probe_times_each_shape_with_paddles_mkl():
    figures = mkl_path.measure(["5"], rounds=1, seconds=0.02)
    assert set(figures["5"]) == set(mkl_path.SHAPES)
    assert all(gflops > 1.0 for gflops in figures["5"].values())


def _apply_in_fresh_process(cache_dir, **env_overrides):
    env = {k: v for k, v in os.environ.items() if k not in cpu_env.SETTINGS and k != cpu_env.INHERITED}
    env.update(PYTHONPATH=REPO, ALIGNMENT_CACHE_DIR=str(cache_dir), **env_overrides)
    code = "import os; from alignment.cpu_env import apply_cpu_defaults; apply_cpu_defaults(); " \
           "print(os.environ.get('MKL_DEBUG_CPU_TYPE'))"
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, cwd=REPO)
    done.check_returncode()
    return done.stdout.strip().splitlines()[-1]


@pytest.mark.skipif(len(mkl_path.possible_paths(cpu_env.cpuinfo_fields())) < 2,
                    reason="this CPU has one MKL path or none: nothing is measured")
def test_an_entry_point_takes_the_kept_choice_and_measures_nothing_when_the_user_chose(tmp_path):
    cpu = cpu_env.cpuinfo_fields()
    for kept in ("5", "7"):  # the file, not the CPU family, decides
        (tmp_path / "mkl_paths.json").write_text(json.dumps({mkl_path.cpu_key(cpu): {"path": kept}}))
        assert _apply_in_fresh_process(tmp_path) == kept
    empty = tmp_path / "empty"
    assert _apply_in_fresh_process(empty, MKL_DEBUG_CPU_TYPE="5") == "5"
    assert not empty.exists()  # the user's value: nothing measured, nothing written


RACE = """
import json, sys, time
from alignment import mkl_path
def slow(paths):
    with open(sys.argv[1], "a") as f:
        f.write("measured\\n")
    time.sleep(1.0)
    return {"7": {"decode": 2.0}, "5": {"decode": 1.0}}
print(mkl_path.measured_choice({"vendor_id": "AuthenticAMD", "flags": "x"}, ["7", "5"], measure_paths=slow))
"""


def test_processes_starting_together_measure_once(tmp_path):
    env = {**os.environ, "PYTHONPATH": REPO, "ALIGNMENT_CACHE_DIR": str(tmp_path / "cache")}
    log = tmp_path / "log"
    ranks = [subprocess.Popen([sys.executable, "-c", RACE, str(log)], env=env, stdout=subprocess.PIPE, text=True)
             for _ in range(3)]
    outputs = [rank.communicate(timeout=60)[0].strip() for rank in ranks]
    assert outputs == ["7", "7", "7"] and log.read_text() == "measured\n"


def test_the_command_measures_again_and_prints_what_an_entry_point_would_choose(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in cpu_env.SETTINGS and k != cpu_env.INHERITED}
    env.update(PYTHONPATH=REPO, ALIGNMENT_CACHE_DIR=str(tmp_path))
    done = subprocess.run([sys.executable, "-m", "alignment.cpu_env"], env=env, capture_output=True, text=True,
                          cwd=REPO)
    assert done.returncode == 0, done.stderr
    cpu = cpu_env.cpuinfo_fields()
    paths = mkl_path.possible_paths(cpu)
    assert "usable cores; OMP_NUM_THREADS=1" in done.stdout
    if len(paths) < 2 or mkl_path.mkl_library_dir() is None:
        assert not (tmp_path / "mkl_paths.json").exists()
        return
    entry = json.loads((tmp_path / "mkl_paths.json").read_text())[mkl_path.cpu_key(cpu)]
    assert set(entry["gflops"]) == {"7", "5"} and entry["path"] == mkl_path.faster(entry["gflops"])
    assert f"MKL_DEBUG_CPU_TYPE={entry['path']}" in done.stdout.splitlines()[-1]
    assert all(f"MKL_DEBUG_CPU_TYPE={path}: decode 8x1536x576" in done.stdout for path in ("7", "5"))
