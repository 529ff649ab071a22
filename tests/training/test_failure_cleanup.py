"""A program that fails, however it fails, leaves no lock file and no empty output folder it made
(alignment/exits.py's on_failure; training/output_dir.py registers the cleanup when it claims a folder), and a
thread that cannot start for want of address space is reported as too little memory (exit 2), not as a bug."""
import os
import subprocess
import sys
import textwrap

import pytest

from tests.helpers import REPO

# A program run through run_program: claims OUT (as every stage does), then fails the way argv[2] says.
PROGRAM = textwrap.dedent("""
    import resource, sys, threading, types
    from alignment.exits import run_program
    from alignment.training.output_dir import claim_output_dir

    out, how = sys.argv[1], sys.argv[2]

    def main():
        claim_output_dir(types.SimpleNamespace(output_dir=out, resume_from_checkpoint=None,
                                               overwrite_output_dir=False, logging_dir=None))
        if how == "bug":
            return 1 / 0
        if how == "exit":
            raise SystemExit(3)
        if how == "done":
            return 0
        # a real "can't start new thread": a stack far larger than the address space left under the limit
        with open("/proc/self/status") as f:
            size = next(int(line.split()[1]) for line in f if line.startswith("VmSize:")) << 10
        resource.setrlimit(resource.RLIMIT_AS, (size + (256 << 20), resource.RLIM_INFINITY))
        threading.stack_size(1 << 30)
        threading.Thread(target=lambda: None).start()

    sys.exit(run_program(main, uses_paddle=False))
""")


def run(tmp_path, out, how):
    env = {**os.environ, "PYTHONPATH": REPO}
    env.pop("ALIGNMENT_DEBUG", None)
    return subprocess.run([sys.executable, "-c", PROGRAM, str(out), how], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("how, code", [("bug", 1), ("exit", 3), ("thread", 2)])
def test_a_failed_program_removes_the_folder_it_made_and_its_lock_file(tmp_path, how, code):
    made, kept = tmp_path / "made", tmp_path / "kept"
    kept.mkdir()
    (kept / "notes.txt").write_text("the user's")
    for out in (made, kept):
        result = run(tmp_path, out, how)
        assert result.returncode == code, result.stderr
        assert "Traceback" not in result.stderr
    assert not made.exists()
    assert sorted(os.listdir(kept)) == ["notes.txt"]  # the lock file went, the user's file stayed


def test_a_thread_that_cannot_start_is_reported_as_too_little_memory(tmp_path):
    result = run(tmp_path, tmp_path / "out", "thread")
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1, result.stderr
    assert lines[0].startswith("error: out of memory (can't start new thread): the address-space limit is ")
    assert "ulimit -v" in lines[0]


def test_a_program_that_succeeds_keeps_its_folder(tmp_path):
    result = run(tmp_path, tmp_path / "out", "done")
    assert result.returncode == 0, result.stderr
    assert os.path.isdir(tmp_path / "out")
