"""The built-in `python` tool: the policy's code run in a separate, limited process.

The child is `sys.executable -I` (no user site, no PYTHON* variables) with a minimal environment, in a fresh
temporary working directory removed afterwards (with its stdout/stderr files). Before the code runs, the child:

1. cuts itself off the network: `unshare(CLONE_NEWUSER | CLONE_NEWNET)` (a new network namespace with only a
   loopback that is down) where the kernel allows unprivileged user namespaces; where it does not (or with
   `network="audit-hook"`), it installs a `sys.addaudithook` hook, which Python cannot remove, refusing sockets,
   ctypes, new processes and raising resource limits. `SandboxResult.network` says which applied.
2. lowers its resource limits (soft and hard): address space (RLIMIT_AS), CPU seconds (RLIMIT_CPU), size of any
   file it writes (RLIMIT_FSIZE), no core files. They are set by the child's own first lines rather than in a
   `preexec_fn`, which Python documents as unsafe in a process with threads (a trainer has many).

The parent kills the whole process group at the wall-time limit. Not covered: it runs as your user, so it is no
filesystem jail (a write outside its working directory is not undone), and in the namespace mode a process it
spawns that leaves its process group survives the kill.
"""
from __future__ import annotations

import dataclasses
import os
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
from typing import NamedTuple, Optional

from alignment.envs.tools import Tool, tool_schema

NETWORK_MODES = ("auto", "audit-hook")

# The child's first lines (argv: status fd, network mode, memory, cpu seconds, file bytes). Kept in this file
# as text so the child needs nothing importable but the standard library.
_RUNNER = r'''
import ctypes, os, resource, runpy, sys, traceback
status_fd, mode, memory, cpu, file_bytes = int(sys.argv[1]), sys.argv[2], *map(int, sys.argv[3:6])
isolation = "audit-hook"
if mode == "auto":
    try:
        if ctypes.CDLL(None, use_errno=True).unshare(0x10000000 | 0x40000000) == 0:
            isolation = "namespace"
    except (OSError, AttributeError):
        pass
# CPU: SIGXCPU at the soft limit (the hard one, a second later, would be SIGKILL)
for limit, soft, hard in ((resource.RLIMIT_AS, memory, memory), (resource.RLIMIT_CPU, cpu, cpu + 1),
                          (resource.RLIMIT_FSIZE, file_bytes, file_bytes), (resource.RLIMIT_CORE, 0, 0)):
    resource.setrlimit(limit, (soft, hard))
BLOCKED = ("socket.", "ctypes.", "subprocess.", "os.system", "os.exec", "os.posix_spawn", "os.spawn", "os.fork",
           "os.forkpty", "resource.setrlimit", "resource.prlimit")
def _hook(event, args):
    if event.startswith(BLOCKED):
        raise PermissionError(f"sandbox: {event} is blocked (no network, no new processes)")
if isolation == "audit-hook":
    sys.addaudithook(_hook)
os.write(status_fd, isolation.encode())
os.close(status_fd)
path = "main.py"
sys.argv = [path]
try:
    runpy.run_path(path, run_name="__main__")
except SystemExit:
    raise
except BaseException as err:
    tb = err.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_filename != path:
        tb = tb.tb_next
    traceback.print_exception(type(err), err, tb)
    sys.exit(1)
'''


class SandboxError(RuntimeError):
    """The code raised, was killed at a limit, or exited non-zero; the message holds its output."""


@dataclasses.dataclass(frozen=True)
class SandboxLimits:
    wall_seconds: float = 5.0
    cpu_seconds: int = 5
    memory_bytes: int = 1 << 30
    file_bytes: int = 16 << 20  # any file the code writes, its stdout and stderr included
    output_chars: int = 4000  # of stdout and of stderr kept in the result
    network: str = "auto"  # see NETWORK_MODES and the module docstring

    def __post_init__(self):
        if self.network not in NETWORK_MODES:
            raise ValueError(f"python sandbox: network must be one of {', '.join(NETWORK_MODES)}, "
                             f"got {self.network!r}")
        if self.wall_seconds <= 0 or self.cpu_seconds < 1 or self.memory_bytes < (64 << 20):
            raise ValueError("python sandbox: wall_seconds > 0, cpu_seconds >= 1 and memory_bytes >= 64 MiB needed")


class SandboxResult(NamedTuple):
    stdout: str
    stderr: str
    returncode: Optional[int]  # None when killed at the wall-time limit
    timed_out: bool
    network: str  # "namespace" or "audit-hook": how the network was cut off ("" if the child never said)
    seconds: float


def run_python(code: str, limits: SandboxLimits = SandboxLimits()) -> SandboxResult:
    """Run `code` as a script in the sandbox; never leaves a file behind."""
    root = tempfile.mkdtemp(prefix="alignment-sandbox-")
    try:
        work = os.path.join(root, "work")
        os.mkdir(work)
        with open(os.path.join(work, "main.py"), "w", encoding="utf-8") as f:
            f.write(code)
        return _run(root, work, limits)
    finally:
        _remove_tree(root)


def _run(root: str, work: str, limits: SandboxLimits) -> SandboxResult:
    status_read, status_write = os.pipe()
    argv = [sys.executable, "-I", "-c", _RUNNER, str(status_write), limits.network, str(limits.memory_bytes),
            str(limits.cpu_seconds), str(limits.file_bytes)]
    env = {"PATH": os.defpath, "HOME": work, "TMPDIR": work, "LANG": "C.UTF-8", "PYTHONIOENCODING": "utf-8"}
    start = time.perf_counter()
    with open(os.path.join(root, "stdout"), "wb") as out, open(os.path.join(root, "stderr"), "wb") as err:
        try:
            proc = subprocess.Popen(argv, cwd=work, env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=err,
                                    pass_fds=(status_write,), start_new_session=True)
        finally:
            os.close(status_write)
        try:
            returncode, timed_out = proc.wait(timeout=limits.wall_seconds), False
        except subprocess.TimeoutExpired:
            returncode, timed_out = None, True
        finally:
            _kill_group(proc.pid)
            proc.wait()
    with os.fdopen(status_read, "rb") as status:
        network = status.read(64).decode(errors="replace")
    return SandboxResult(_head(os.path.join(root, "stdout"), limits.output_chars),
                         _head(os.path.join(root, "stderr"), limits.output_chars),
                         returncode, timed_out, network, time.perf_counter() - start)


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _head(path: str, chars: int) -> str:
    with open(path, "rb") as f:
        data = f.read(chars * 4 + 1)  # a character is at most 4 bytes of UTF-8
    text = data.decode("utf-8", errors="replace")
    more = len(text) > chars or os.path.getsize(path) > len(data)
    return f"{text[:chars]}... [output cut at {chars} characters]" if more else text


def _remove_tree(root: str) -> None:
    """rmtree that also removes what the code made unwritable (chmod 000 directories)."""
    def retry(function, path, _):
        os.chmod(os.path.dirname(path), stat.S_IRWXU)
        if os.path.isdir(path) and not os.path.islink(path):
            os.chmod(path, stat.S_IRWXU)
        function(path)

    shutil.rmtree(root, onerror=retry)


def describe_failure(result: SandboxResult, limits: SandboxLimits) -> Optional[str]:
    """Why a run failed, with its output (None when it exited 0)."""
    if result.timed_out:
        reason = f"timed out after {limits.wall_seconds:g} s (wall time)"
    elif result.returncode == -signal.SIGXCPU:
        reason = f"killed at the CPU-time limit ({limits.cpu_seconds} s)"
    elif result.returncode is not None and result.returncode < 0:
        reason = f"killed by signal {signal.Signals(-result.returncode).name}"
    elif result.returncode != 0:
        reason = f"exited with code {result.returncode}"
    else:
        return None
    output = "\n".join(part for part in (result.stdout.rstrip(), result.stderr.rstrip()) if part)
    return f"{reason}\n{output}" if output else reason


def python(code: str) -> str:
    """Run a Python script in a sandbox (no network, limited time and memory) and return what it prints.

    Args:
        code: The Python source to run; use print() to show results.
    """
    return run_checked(code, SandboxLimits())


def run_checked(code: str, limits: SandboxLimits) -> str:
    """What the script prints; SandboxError (with its output) when it fails."""
    if not isinstance(code, str):
        raise SandboxError(f"code must be a string, got {type(code).__name__}")
    result = run_python(code, limits)
    failure = describe_failure(result, limits)
    if failure is not None:
        raise SandboxError(failure)
    return result.stdout if result.stdout else "(no output)"


def python_tool(limits: SandboxLimits) -> Tool:
    """The `python` tool with other limits, e.g. `ToolEnvironment(tools=[python_tool(SandboxLimits(wall_seconds=2))])`
    (its call timeout leaves the sandbox 5 s to kill and clean up first)."""
    def run(code: str) -> str:  # only `code`: the policy's arguments cannot reach the limits
        return run_checked(code, limits)

    return Tool("python", run, tool_schema(python), limits.wall_seconds + 5.0)
