"""The `python` tool's sandbox, with real child processes: wall-time, CPU and memory limits, no network (the full
containment and the audit-hook fallback), nothing left on disk, errors and output bounds. What the containment
stops (files, processes, signals, budgets) is in test_sandbox_containment.py."""
import os
import signal
import re
import socket
import threading
import time

import pytest

from alignment.envs import BUILTIN_TOOLS, SandboxLimits, ToolCall, python, run_python, run_tool_call
from alignment.envs.sandbox.runner import SandboxError, describe_failure
from test_sandbox_containment import LACKS

MODES = ("full", "audit-hook")
pytestmark = pytest.mark.skipif(bool(LACKS), reason=f"this kernel cannot contain the sandbox: it lacks {LACKS}")


def test_a_script_runs_and_prints():
    result = run_python("print(sum(range(101)))\nimport sys; print('err', file=sys.stderr)")
    assert (result.stdout, result.stderr, result.returncode, result.timed_out) == ("5050\n", "err\n", 0, False)
    assert python("print(6 * 7)") == "42\n"
    assert python("x = 1") == "(no output)"


def test_an_infinite_loop_times_out_within_the_limit():
    start = time.perf_counter()
    result = run_python("while True:\n    pass", SandboxLimits(wall_seconds=1.0, cpu_seconds=30))
    elapsed = time.perf_counter() - start
    assert result.timed_out and result.returncode is None
    assert 1.0 <= elapsed < 1.0 + 2.0


def test_a_timeout_reaches_the_policy_as_an_error_observation():
    start = time.perf_counter()
    result = run_tool_call(ToolCall("python", {"code": "import time\nprint('started', flush=True)\ntime.sleep(60)"}),
                           BUILTIN_TOOLS)
    default_wall = SandboxLimits().wall_seconds
    assert time.perf_counter() - start < default_wall + 2.0
    assert result.error
    assert result.content == (f"Error: tool 'python' raised SandboxError: timed out after {default_wall:g} s "
                              f"(wall time)\nstarted")


def test_the_cpu_limit_kills_a_busy_process_before_the_wall_limit():
    start = time.perf_counter()
    result = run_python("while True:\n    pass", SandboxLimits(wall_seconds=20, cpu_seconds=1))
    assert not result.timed_out and result.returncode == -signal.SIGXCPU
    assert time.perf_counter() - start < 5
    assert describe_failure(result, SandboxLimits(cpu_seconds=1)) == "killed at the CPU-time limit (1 s)"


def test_allocating_2_gb_fails_under_the_memory_limit():
    result = run_python("x = bytearray(2 * 1024 ** 3)\nprint('allocated')")
    assert result.returncode == 1 and result.stdout == ""
    assert result.stderr.rstrip().endswith("MemoryError")


@pytest.mark.parametrize("mode", MODES)
def test_no_network_even_to_a_listening_local_port(mode):
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(4)
    port = server.getsockname()[1]
    accepted = []
    server.settimeout(0.2)

    def accept():
        while not stop.is_set():
            try:
                accepted.append(server.accept()[0])
            except OSError:
                pass

    stop = threading.Event()
    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=2):  # the port really is open from here
            pass
        time.sleep(0.3)
        assert len(accepted) == 1
        code = f"import socket\ns = socket.socket()\ns.settimeout(3)\ns.connect(('127.0.0.1', {port}))\nprint('in')"
        result = run_python(code, SandboxLimits(containment=mode))
        time.sleep(0.3)
    finally:
        stop.set()
        thread.join()
        server.close()
        for connection in accepted:
            connection.close()
    assert result.returncode == 1 and result.stdout == "" and len(accepted) == 1
    assert "ConnectionRefusedError" not in result.stderr
    if mode == "full":  # Landlock refuses TCP connect (ABI >= 4); without it the namespace's loopback is down
        assert "namespaces" in result.layers and "audit-hook" not in result.layers
        refusal = ("PermissionError: [Errno 13] Permission denied" if "landlock-net" in result.layers
                   else "OSError: [Errno 101] Network is unreachable")
        assert refusal in result.stderr
    else:
        assert result.layers == ("audit-hook",)
        assert "PermissionError: sandbox: socket.__new__ is blocked" in result.stderr


def test_the_audit_hook_blocks_new_processes_and_raising_limits():
    limits = SandboxLimits(containment="audit-hook")
    spawn = run_python("import subprocess\nsubprocess.run(['true'])", limits)
    assert "PermissionError: sandbox: subprocess.Popen is blocked" in spawn.stderr
    system = run_python("import os\nos.system('true')", limits)
    assert "PermissionError: sandbox: os.system is blocked" in system.stderr
    rlimit = run_python("import resource\nresource.setrlimit(resource.RLIMIT_AS, (-1, -1))", limits)
    assert "PermissionError: sandbox: resource.setrlimit is blocked" in rlimit.stderr
    remove = run_python("import sys\nsys.audit_hooks = []\nimport socket\nsocket.socket()", limits)
    assert "socket.__new__ is blocked" in remove.stderr


@pytest.mark.parametrize("mode", MODES)
def test_nothing_it_writes_survives(mode):
    code = ("import os\nos.makedirs('sub/deeper')\nopen('sub/deeper/f.txt', 'w').write('x' * 1000)\n"
            "open('top.bin', 'wb').write(b'y')\nos.chmod('sub', 0)\nprint(os.getcwd())")
    result = run_python(code, SandboxLimits(containment=mode))
    assert result.returncode == 0, result.stderr
    work = result.stdout.strip()
    if mode == "full":  # a tmpfs of its own on /tmp, gone with its mount namespace
        assert work == "/tmp/work" and "tmpfs" in result.layers
    else:  # a temporary directory of the host, removed afterwards
        assert os.path.basename(work) == "work" and os.path.basename(os.path.dirname(work)).startswith(
            "alignment-sandbox-")
        assert not os.path.exists(os.path.dirname(work))


def test_a_raise_is_error_text_with_the_traceback_of_the_code_only():
    result = run_python("def f():\n    raise ValueError('boom')\nf()")
    assert result.returncode == 1
    assert result.stderr == ('Traceback (most recent call last):\n  File "main.py", line 3, in <module>\n    f()\n'
                             '  File "main.py", line 2, in f\n    raise ValueError(\'boom\')\nValueError: boom\n')
    with pytest.raises(SandboxError, match="exited with code 1\nTraceback"):
        python("raise ValueError('boom')")
    observation = run_tool_call(ToolCall("python", {"code": "print('partial')\n1/0"}), BUILTIN_TOOLS)
    assert observation.error and observation.content.startswith(
        "Error: tool 'python' raised SandboxError: exited with code 1\npartial\nTraceback")
    assert observation.content.endswith("ZeroDivisionError: division by zero")
    syntax = run_python("def (")
    assert syntax.returncode == 1 and "SyntaxError" in syntax.stderr


def test_output_is_cut_and_file_size_is_bounded():
    result = run_python("print('x' * 100000)", SandboxLimits(output_chars=50))
    assert result.stdout == "x" * 50 + "... [output cut at 50 characters]"
    big = run_python("open('big', 'wb').write(b'0' * (2 << 20))", SandboxLimits(file_bytes=1 << 20))
    assert big.returncode == 1 and "OSError: [Errno 27] File too large" in big.stderr


def test_the_environment_of_the_child_is_minimal():
    os.environ["ALIGNMENT_SANDBOX_SECRET"] = "leak"
    try:
        result = run_python("import os, sys\nprint(sorted(os.environ))\nprint(sys.flags.isolated)")
    finally:
        del os.environ["ALIGNMENT_SANDBOX_SECRET"]
    assert result.stdout.splitlines() == ["['HOME', 'LANG', 'MKL_NUM_THREADS', 'OMP_NUM_THREADS', "
                                          "'OPENBLAS_NUM_THREADS', 'PATH', 'PYTHONIOENCODING', 'TMPDIR']", "1"]


@pytest.mark.parametrize("kwargs, message", [
    ({"containment": "off"}, "containment must be one of full, best-effort, audit-hook, got 'off'"),
    ({"wall_seconds": 0}, "wall_seconds must be a number > 0, got 0"),
    ({"memory_bytes": "1G"}, "memory_bytes must be an integer >= 67108864, got '1G'"),
    ({"max_processes": True}, "max_processes must be an integer >= 1, got True"),
    ({"disk_bytes": 1000}, "disk_bytes must be an integer >= 1048576, got 1000"),
])
def test_bad_limits_are_refused(kwargs, message):
    with pytest.raises(ValueError, match=re.escape(f"python sandbox: {message}")):
        SandboxLimits(**kwargs)


def test_a_python_tool_with_its_own_limits_cannot_be_given_others_by_the_policy():
    from alignment.envs.sandbox.runner import python_tool

    tools = {"python": python_tool(SandboxLimits(wall_seconds=0.5))}
    assert tools["python"].schema == BUILTIN_TOOLS["python"].schema and tools["python"].timeout == 5.5
    start = time.perf_counter()
    result = run_tool_call(ToolCall("python", {"code": "while True: pass"}), tools)
    assert time.perf_counter() - start < 0.5 + 2.0
    assert result.content == "Error: tool 'python' raised SandboxError: timed out after 0.5 s (wall time)"
    sneaky = run_tool_call(ToolCall("python", {"code": "print(1)", "limits": None}), tools)
    assert sneaky.content == "Error: tool 'python': bad arguments (got an unexpected keyword argument 'limits')"
