"""The kernel choice counts other processes' load while it times (choice.py): a measurement taken on a busy machine
is taken again by the next process, up to MEASUREMENTS times, and the quietest stands."""
import json
import subprocess
import sys
import time

import pytest

from alignment.cpu_kernels import choice


def test_others_cores_is_the_cpu_time_not_ours_over_the_wall_time():
    assert choice.others_cores((100.0, 10.0), (103.0, 11.0), 4.0) == pytest.approx(0.5)  # (3 - 1) / 4
    assert choice.others_cores((100.0, 10.0), (100.5, 11.0), 1.0) == 0.0  # our own time read later than /proc's


def test_a_spinning_process_shows_as_about_one_busy_core():
    spinner = subprocess.Popen([sys.executable, "-c", "import time\nend = time.time() + 30\nwhile time.time() < end: pass"])
    try:
        time.sleep(0.3)  # past its start
        before, start = choice.cpu_seconds(), time.perf_counter()
        time.sleep(1.0)
        busy = choice.others_cores(before, choice.cpu_seconds(), time.perf_counter() - start)
    finally:
        spinner.kill()
        spinner.wait()
    assert 0.7 < busy < 2.1  # one core spun; the rest is whatever else this machine ran


@pytest.fixture
def fake_measurements(tmp_path, monkeypatch):
    """choice.measured_choice over a cache in tmp_path, its timings and load taken from the returned list of
    (kernel_ms, load in cores) in order; the list empties as measurements run."""
    monkeypatch.setenv("ALIGNMENT_CACHE_DIR", str(tmp_path))
    queue = []

    def measure(module, threads):
        kernel_ms, load = queue[0]
        monkeypatch.setattr(choice, "others_cores", lambda before, after, wall: load)
        del queue[0]
        return {"swiglu": {"kernel_ms": kernel_ms, "paddle_ms": 2.0, "kernel_median_ms": kernel_ms,
                           "paddle_median_ms": 2.0}}

    monkeypatch.setattr(choice, "measure", measure)
    return queue


def kept_entry() -> dict:
    with open(choice.cache_file(), encoding="utf-8") as f:
        (entry,) = json.load(f).values()
    return entry


def test_a_busy_measurement_is_repeated_and_the_quietest_of_three_stands(fake_measurements, capsys):
    fake_measurements.extend([(3.0, 1.0), (1.0, 0.5), (1.5, 0.8)])  # busy, less busy (kernel faster), busy
    assert choice.measured_choice(None) == {"swiglu": False}
    assert (kept_entry()["measurements"], kept_entry()["others_cores"]) == (1, 1.0)
    assert choice.measured_choice(None) == {"swiglu": True}  # the quieter one replaces it
    assert choice.measured_choice(None) == {"swiglu": True}  # busier than the kept one: the kept one stands
    assert fake_measurements == [] and (kept_entry()["measurements"], kept_entry()["others_cores"]) == (3, 0.5)
    assert choice.measured_choice(None) == {"swiglu": True}  # three taken: settled, nothing measured
    assert capsys.readouterr().out == ""  # a program's output does not change with the machine's load


def test_a_quiet_measurement_is_kept_at_once(fake_measurements):
    fake_measurements.extend([(3.0, 0.1)])
    assert choice.measured_choice(None) == {"swiglu": False}
    assert choice.measured_choice(None) == {"swiglu": False}  # no second measurement (the queue is empty)
    assert kept_entry()["measurements"] == 1
