"""Memory-limited machines (issue 65 item 4): under an address-space limit (`ulimit -v`, as containers and batch
schedulers set) the entry points start and train; running out of memory is one line naming the limit, exit 2, and a
failed run leaves no lock file (nor an output directory it made and left empty)."""
import json
import os
import subprocess
import sys
import textwrap

from alignment.sft import run_sft
from tests.helpers import REPO

SFT_CONFIG = os.path.join(REPO, "config", "tiny", "sft_argument.json")
LIMIT_KB = 4_000_000  # `ulimit -v 4000000`: 3.8 GiB of address space


def _limited(code: str, **kwargs) -> subprocess.CompletedProcess:
    """Run Python code in a child whose address space is capped at LIMIT_KB, as `ulimit -v` does."""
    prefix = textwrap.dedent(f"""
        import resource, sys
        sys.path.insert(0, {REPO!r})
        resource.setrlimit(resource.RLIMIT_AS, ({LIMIT_KB} << 10, {LIMIT_KB} << 10))
    """)
    return subprocess.run([sys.executable, "-c", prefix + textwrap.dedent(code)], capture_output=True, text=True,
                          timeout=600, **kwargs)


def test_running_out_of_memory_is_one_line_naming_the_limit_and_exit_2():
    done = _limited("""
        from alignment.exits import run_program
        sys.exit(run_program(lambda: bytearray(16 << 30), uses_paddle=False))
    """)
    assert done.returncode == 2, done.stderr[-800:]
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr, done.stderr
    assert done.stderr.startswith("error: out of memory: the address-space limit is 3906 MiB (ulimit -v 4000000)")


def test_sft_trains_under_an_address_space_limit(tmp_path, tiny_model_dir):
    out = tmp_path / "out"
    done = _limited(f"""
        from alignment.sft import run_sft
        run_sft.main([{SFT_CONFIG!r}, "--model_name_or_path", {tiny_model_dir!r}, "--output_dir", {str(out)!r},
                      "--max_steps", "2"])
    """, cwd=REPO)
    assert done.returncode == 0, done.stderr[-800:]
    steps = [json.loads(line)["step"] for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert steps[-1] == 2 and (out / "model" / "model.safetensors").is_file()


def test_a_failed_run_removes_its_lock_from_an_output_dir_that_existed(tmp_path, tiny_model_dir, capsys):
    out = tmp_path / "out"
    out.mkdir()
    (out / "notes.txt").write_text("the user's")
    stop = _run_sft_expecting_exit(out, tiny_model_dir, "--train_datasets", f"alpaca:1.0:{tmp_path}/missing.jsonl")
    err = capsys.readouterr().err
    assert stop == 2 and err.count("\n") == 1 and "missing" in err, err
    assert sorted(os.listdir(out)) == ["notes.txt"]


def test_a_failed_run_removes_the_output_dir_it_made(tmp_path, tiny_model_dir, capsys):
    out = tmp_path / "new" / "out"
    stop = _run_sft_expecting_exit(out, tiny_model_dir, "--train_datasets", f"alpaca:1.0:{tmp_path}/missing.jsonl")
    assert stop == 2 and not out.exists()


def _run_sft_expecting_exit(out, model_dir, *flags) -> int:
    try:
        run_sft.main([SFT_CONFIG, "--model_name_or_path", model_dir, "--output_dir", str(out), *flags])
    except SystemExit as stop:
        return stop.code
    raise AssertionError("the run did not stop")
