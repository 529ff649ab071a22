"""Memory-limited machines (issue 65 item 4): under an address-space limit (`ulimit -v`, as containers and batch
schedulers set) the entry points start and train; running out of memory is one line naming the limit, exit 2, and a
failed run leaves no lock file (nor an output directory it made and left empty)."""
import json
import os
import resource
import subprocess
import sys
import textwrap
import time

import httpx

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


def test_stdin_and_files_are_read_in_chunks_not_by_asking_for_the_limit():
    """An 8 GiB limit on what is read (more than the address space) costs nothing for a small input, text or bytes:
    `f.read(8 << 30)` would be a MemoryError here."""
    done = _limited("""
        import io
        from alignment.inputs import read_at_most
        print(repr(read_at_most(sys.stdin, 8 << 30)), repr(read_at_most(io.BytesIO(b"xy"), 8 << 30)))
    """, input="two\nprompts\n")
    assert done.returncode == 0, done.stderr[-800:]
    assert done.stdout == "'two\\nprompts\\n' b'xy'\n"


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


def _cap_address_space():
    resource.setrlimit(resource.RLIMIT_AS, (LIMIT_KB << 10, LIMIT_KB << 10))


def _limited_server(tool: str, port_file, *args):
    """tools/`tool` --port 0 under the address-space limit; its URL once it listens, or its output if it died."""
    proc = subprocess.Popen([sys.executable, os.path.join(REPO, "tools", tool), *args, "--port", "0",
                             "--port-file", str(port_file)], cwd=REPO, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True, preexec_fn=_cap_address_space)
    deadline = time.time() + 180
    while not port_file.exists() and proc.poll() is None and time.time() < deadline:
        time.sleep(0.1)
    if not port_file.exists():
        proc.kill()
        raise AssertionError(f"{tool} did not start under ulimit -v {LIMIT_KB}: {proc.communicate()[1][-2000:]}")
    return proc, f"http://127.0.0.1:{port_file.read_text().strip()}"


def _stop(proc) -> None:
    proc.terminate()
    proc.wait(timeout=30)


def test_the_reward_server_starts_and_scores_under_an_address_space_limit(tmp_path, tiny_reward_dir):
    proc, url = _limited_server("reward_server.py", tmp_path / "port", "--model", tiny_reward_dir)
    try:
        answer = httpx.post(url + "/", json={"src": ["What is 2+2?", "Name a colour."], "response": ["4", "red"]},
                            timeout=120)
        assert answer.status_code == 200, answer.text
        scores = answer.json()["score"]
        assert len(scores) == 2 and all(isinstance(s, float) for s in scores) and scores[0] != scores[1]
    finally:
        _stop(proc)


def test_the_gateway_starts_and_answers_under_an_address_space_limit(tmp_path, tiny_model_dir):
    proc, url = _limited_server("serve.py", tmp_path / "port", "--model", tiny_model_dir, "--name", "tiny",
                                "--max-tokens", "8")
    try:
        answer = httpx.post(url + "/v1/chat/completions", timeout=120,
                            json={"model": "tiny", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 8,
                                  "temperature": 0})
        assert answer.status_code == 200, answer.text
        usage = answer.json()["usage"]
        assert answer.json()["model"] == "tiny" and 1 <= usage["completion_tokens"] <= 8
    finally:
        _stop(proc)


def test_the_python_sandbox_runs_under_a_lower_address_space_limit_than_its_own():
    """memory_bytes above the caller's limit: the sandbox keeps the caller's (a limit cannot be raised)."""
    done = _limited("""
        from alignment.envs import SandboxLimits, run_python
        result = run_python("import resource; print(resource.getrlimit(resource.RLIMIT_AS))",
                            SandboxLimits(memory_bytes=8 << 30, containment="best-effort"))
        print(result.returncode, result.stdout.strip(), result.stderr[-400:])
    """)
    limit = LIMIT_KB << 10
    assert done.stdout.strip() == f"0 ({limit}, {limit})", done.stdout + done.stderr[-800:]


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
