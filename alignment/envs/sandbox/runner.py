"""The built-in `python` tool: the policy's code run in a separate process contained by the kernel.

The child (`sys.executable -I child.py`, a minimal environment) enters new user, mount, PID, IPC and
network namespaces; the host's mounts are read-only to it and its /tmp, working directory and /dev/shm are a tmpfs
of `disk_bytes`; Landlock lets it read the Python installation and system libraries and write only that tmpfs;
seccomp refuses ptrace, keyrings, eBPF, perf, io_uring, mounts, new namespaces and every socket but the (inert)
internet ones; RLIMIT_NPROC counted in its user namespace caps its processes; rlimits cap memory, CPU time and file
size; when its code ends, or at the wall-time limit, every process it started dies with its PID namespace.
`SandboxResult.layers` lists what applied; docs/agentic/sandbox.md says what each layer stops and on which kernels.

`SandboxLimits.containment`: "full" (default) refuses to run when a required layer (kernel.py's
REQUIRED_LAYERS) is missing, with one line naming what the kernel lacks and how to allow it; "best-effort" runs
with what the kernel has (the audit hook where the namespaces are missing); "audit-hook" is the weak mode only: a
`sys.addaudithook` hook refusing sockets, ctypes and new processes, which code can get around.
`check_containment(limits)` runs that check once per process (ToolEnvironment does it when it is built).
"""
from __future__ import annotations

import dataclasses
import json
import os
import select
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from typing import Any, Dict, Mapping, NamedTuple, Optional, Tuple

from alignment.envs.sandbox.kernel import REQUIRED_LAYERS
from alignment.envs.tools import Tool, tool_schema
from alignment.inputs import read_at_most

CONTAINMENTS = ("full", "best-effort", "audit-hook")
_CHILD = os.path.join(os.path.dirname(os.path.abspath(__file__)), "child.py")
_BOUNDS = (("wall_seconds", 0), ("cpu_seconds", 1), ("memory_bytes", 64 << 20), ("file_bytes", 1),
           ("disk_bytes", 1 << 20), ("max_processes", 1), ("output_chars", 1))
_HOW_TO_OPT_OUT = ("or run it less contained with containment \"best-effort\" (argument file: environment_args "
                   "{\"python_sandbox\": {\"containment\": \"best-effort\"}}; see docs/agentic/sandbox.md)")


class SandboxError(RuntimeError):
    """The code raised, was killed at a limit, or exited non-zero; the message holds its output."""


class SandboxUnavailable(SandboxError):
    """containment "full" and a required layer is missing on this machine; the message says how to allow it."""


@dataclasses.dataclass(frozen=True)
class SandboxLimits:
    """The limits of one run of the `python` tool's code (`python_tool(SandboxLimits(...))`, or an environment's
    `python_sandbox` argument): wall and CPU time, memory, file and disk bytes, processes, kept output, and how
    strictly it is contained (`containment`, see the module docstring)."""

    wall_seconds: float = 5.0
    cpu_seconds: int = 5  # of each process
    memory_bytes: int = 1 << 30  # address space of each process
    file_bytes: int = 16 << 20  # any file the code writes, its stdout and stderr included
    disk_bytes: int = 64 << 20  # everything it writes (its tmpfs: working directory, /tmp, /dev/shm)
    max_processes: int = 16  # processes and threads at once, the code's own included
    output_chars: int = 4000  # of stdout and of stderr kept in the result
    containment: str = "full"  # see CONTAINMENTS and the module docstring

    def __post_init__(self):
        if self.containment not in CONTAINMENTS:
            raise ValueError(f"python sandbox: containment must be one of {', '.join(CONTAINMENTS)}, "
                             f"got {self.containment!r}")
        for name, bound in _BOUNDS:
            value = getattr(self, name)
            number = isinstance(value, (int, float) if name == "wall_seconds" else int) and not isinstance(value, bool)
            if not number or (value <= bound if name == "wall_seconds" else value < bound):
                relation = "a number > 0" if name == "wall_seconds" else f"an integer >= {bound}"
                raise ValueError(f"python sandbox: {name} must be {relation}, got {value!r}")


def sandbox_limits(options: Any) -> SandboxLimits:
    """SandboxLimits from an argument file's mapping (environment_args' "python_sandbox")."""
    if not isinstance(options, Mapping):
        raise ValueError(f"python_sandbox must be a mapping of SandboxLimits fields, got {options!r}")
    known = [field.name for field in dataclasses.fields(SandboxLimits)]
    unknown = sorted(set(options) - set(known))
    if unknown:
        raise ValueError(f"python_sandbox: unknown key {unknown[0]!r} (known: {', '.join(known)})")
    return SandboxLimits(**options)


class SandboxResult(NamedTuple):
    stdout: str
    stderr: str
    returncode: Optional[int]  # None when killed at the wall-time limit
    timed_out: bool
    layers: Tuple[str, ...]  # the containment that applied (child.py's names; () if it never said)
    seconds: float


def run_python(code: str, limits: SandboxLimits = SandboxLimits()) -> SandboxResult:
    """Run `code` as a script in the sandbox; never leaves a file behind. Safe to call from several threads."""
    root = tempfile.mkdtemp(prefix="alignment-sandbox-")
    try:
        work = os.path.join(root, "work")  # the working directory when there is no tmpfs
        os.mkdir(work)
        code_path = os.path.join(root, "code.py")
        with open(code_path, "w", encoding="utf-8") as f:
            f.write(code)
        return _run(root, work, code_path, limits)
    finally:
        _remove_tree(root)


def _run(root: str, work: str, code_path: str, limits: SandboxLimits) -> SandboxResult:
    status_read, status_write = os.pipe()
    settings = {"mode": limits.containment, "memory": limits.memory_bytes, "cpu": limits.cpu_seconds,
                "file_bytes": limits.file_bytes, "disk_bytes": limits.disk_bytes,
                "processes": limits.max_processes, "code": code_path, "work": work, "status_fd": status_write,
                "parent": os.getpid()}
    env = {"PATH": os.defpath, "HOME": work, "TMPDIR": work, "LANG": "C.UTF-8", "PYTHONIOENCODING": "utf-8",
           # one thread per BLAS/OpenMP pool: threads count against max_processes
           "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    start = time.perf_counter()
    with open(os.path.join(root, "stdout"), "wb") as out, open(os.path.join(root, "stderr"), "wb") as err, \
            os.fdopen(status_read, "rb") as status:
        os.set_blocking(status_read, False)
        try:
            proc = subprocess.Popen([sys.executable, "-I", _CHILD, json.dumps(settings)], cwd=work, env=env,
                                    stdin=subprocess.DEVNULL, stdout=out, stderr=err, pass_fds=(status_write,),
                                    start_new_session=True)
        finally:
            os.close(status_write)
        said = b""
        try:
            returncode = _wait(proc, limits.wall_seconds)
            if returncode is None:
                said = _drain(status_read, said)
                if "namespaces" in _report(said).get("layers", ()):
                    proc.terminate()  # the child kills its PID namespace and waits until it is empty
                    _wait(proc, 2.0)
        finally:
            _kill_group(proc.pid)
            proc.wait()
        report = _report(_drain(status_read, said))
        timed_out = returncode is None
    if report.get("refused"):
        raise SandboxUnavailable(refusal_message(report["missing"]))
    return SandboxResult(_head(os.path.join(root, "stdout"), limits.output_chars),
                         _head(os.path.join(root, "stderr"), limits.output_chars),
                         returncode, timed_out, tuple(report.get("layers", ())), time.perf_counter() - start)


def _wait(proc: subprocess.Popen, timeout: float) -> Optional[int]:
    """Its return code, or None after `timeout` seconds. A pidfd wakes at the exit: Popen.wait(timeout) polls with
    sleeps growing to 50 ms, which added up to 50 ms to every call."""
    try:
        pidfd = os.pidfd_open(proc.pid)
    except OSError:  # Linux < 5.3
        try:
            return proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return None
    try:
        poller = select.poll()
        poller.register(pidfd, select.POLLIN)
        return proc.wait() if poller.poll(timeout * 1000) else None
    finally:
        os.close(pidfd)


def _drain(fd: int, data: bytes) -> bytes:
    while True:
        try:
            chunk = os.read(fd, 4096)
        except BlockingIOError:
            return data
        if not chunk:
            return data
        data += chunk


def _report(data: bytes) -> Dict[str, Any]:
    line = data.split(b"\n", 1)[0]
    try:
        return json.loads(line) if line else {}
    except ValueError:
        return {}


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _head(path: str, chars: int) -> str:
    with open(path, "rb") as f:
        data = read_at_most(f, chars * 4 + 1)  # a character is at most 4 bytes of UTF-8
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


# --------------------------------------------------------------------------- the check at start-up


def refusal_message(missing: Mapping[str, str]) -> str:
    """One line: which required layers are missing, why, and how to allow them."""
    lacking = "; ".join(f"{layer}: {missing[layer]}" for layer in REQUIRED_LAYERS if layer in missing)
    hints = []
    if {"namespaces", "read-only", "tmpfs"} & set(missing):
        if _sysctl("kernel/apparmor_restrict_unprivileged_userns") == "1":
            hints.append("Ubuntu's AppArmor restricts unprivileged user namespaces: "
                         "`sudo sysctl kernel.apparmor_restrict_unprivileged_userns=0`")
        elif _sysctl("kernel/unprivileged_userns_clone") == "0":
            hints.append("unprivileged user namespaces are off: `sudo sysctl kernel.unprivileged_userns_clone=1`")
        elif _sysctl("user/max_user_namespaces") == "0":
            hints.append("user namespaces are off: `sudo sysctl user.max_user_namespaces=15000`")
        else:
            hints.append("user namespaces are refused here (in a container: its seccomp profile must allow "
                         "unshare and mount)")
    landlock = missing.get("landlock", "")
    if "Errno 38" in landlock:
        hints.append("the kernel has no Landlock: Linux >= 5.13 built with CONFIG_SECURITY_LANDLOCK")
    elif "Errno 95" in landlock:
        hints.append("Landlock is built in but off: add landlock to the kernel's lsm= boot parameter")
    return f"python sandbox: cannot contain the python tool here ({lacking}); {'; '.join(hints + [_HOW_TO_OPT_OUT])}"


def _sysctl(name: str) -> Optional[str]:
    try:
        with open(f"/proc/sys/{name}") as f:
            return f.read().strip()
    except OSError:
        return None


_checked: Dict[str, Tuple[str, ...]] = {}
_check_lock = threading.Lock()


def check_containment(limits: SandboxLimits = SandboxLimits()) -> Tuple[str, ...]:
    """The layers the python tool gets on this machine: one probe run per process and containment.
    SandboxUnavailable (containment "full") names what the kernel lacks; a weaker containment warns once."""
    with _check_lock:
        if limits.containment not in _checked:
            probe = run_python("", limits)
            failure = describe_failure(probe, limits)
            if failure is not None:
                raise SandboxUnavailable(f"python sandbox: a first run of nothing failed: {failure}")
            weaker = [layer for layer in REQUIRED_LAYERS if layer not in probe.layers]
            if weaker:
                warnings.warn(f"python sandbox: containment {limits.containment!r} runs without "
                              f"{', '.join(weaker)} (docs/agentic/sandbox.md)", stacklevel=2)
            _checked[limits.containment] = probe.layers
        return _checked[limits.containment]


# --------------------------------------------------------------------------- the tool


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


class SandboxedPython:
    """The `python` tool's function with its limits (only `code` comes from the policy)."""

    def __init__(self, limits: SandboxLimits):
        self.limits = limits

    def __call__(self, code: str) -> str:
        return run_checked(code, self.limits)


def python_tool(limits: SandboxLimits) -> Tool:
    """The `python` tool with other limits, e.g. `ToolEnvironment(tools=[python_tool(SandboxLimits(wall_seconds=2))])`
    (its call timeout leaves the sandbox 5 s to kill and clean up first)."""
    return Tool("python", SandboxedPython(limits), tool_schema(python), limits.wall_seconds + 5.0)


def check_tools(tools) -> None:
    """check_containment for every sandboxed `python` tool among `tools` (Tool objects)."""
    for tool in tools:
        if isinstance(tool.fn, SandboxedPython):
            check_containment(tool.fn.limits)
