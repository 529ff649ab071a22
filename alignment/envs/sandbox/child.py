"""The python sandbox's child: `python -I child.py SETTINGS` (runner.py starts it; standard library only).

With the namespaces (every containment but "audit-hook") it is three processes:
  R, this one, in the caller's PID namespace: enters new user, mount, PID, IPC, network, UTS and cgroup
    namespaces (hostname "sandbox"), makes the host's mounts read-only and mounts a tmpfs of `disk_bytes` on /tmp
    (the work directory and /dev/shm; a Python installation under /tmp kept there read-only), forks C and passes on how G ended. On SIGTERM (the caller's wall-time
    limit) it kills C and waits for the namespace to empty. It dies with the caller (PR_SET_PDEATHSIG), C with it.
  C, PID 1 of the new PID namespace: mounts its /proc, sets the limits, drops every capability, applies Landlock
    and seccomp, reports the layers on the status pipe, forks G and reaps until G ends; when C exits the kernel
    kills every process left in the namespace, those that left the process group (setsid, double fork) too.
  G runs the code.
A trainer running as root has R become nobody (65534) before the user namespace, as the process cap (RLIMIT_NPROC,
counted per user namespace since Linux 5.14) does not bind root; first, in a mount namespace of its own, it makes
a Python installation under a directory nobody may not enter (pyenv's /root) reachable (expose).
Without the namespaces R applies what the kernel has and runs the code itself under the audit hook.
"""
import json
import os
import resource
import runpy
import select
import signal
import site
import stat
import sys
import traceback

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import kernel  # noqa: E402 (a sibling file: the child imports nothing of the package)

del sys.path[0]

NOBODY = 65534
WORK, TMP, SHM = "/tmp/work", "/tmp", "/tmp/.shm"
SYSTEM = ("/usr", "/lib", "/lib64", "/lib32", "/bin", "/sbin", "/etc/ld.so.cache", "/etc/localtime", "/etc/mime.types",
          "/sys/devices/system/cpu", "/dev/urandom", "/dev/random", "/dev/zero", "/dev/full")
BLOCKED = ("socket.", "ctypes.", "subprocess.", "os.system", "os.exec", "os.posix_spawn", "os.spawn", "os.fork",
           "os.forkpty", "resource.setrlimit", "resource.prlimit")


class Setup:
    """The layers that applied and, for those that did not, why."""

    def __init__(self):
        self.layers, self.missing = [], {}

    def attempt(self, layer, action, *args) -> bool:
        try:
            action(*args)
        except OSError as err:
            self.missing[layer] = str(err)
            return False
        self.layers.append(layer)
        return True


def python_dirs() -> list:
    """The Python installation: prefixes, standard library, site-packages (not directories .pth files add)."""
    dirs = {sys.prefix, sys.exec_prefix, sys.base_prefix, sys.base_exec_prefix, os.path.dirname(os.__file__),
            os.path.dirname(os.path.realpath(sys.executable)), *site.getsitepackages()}
    return sorted(d for d in dirs if os.path.isdir(d) and os.path.realpath(d) != "/")


def closed_ancestor(path: str):
    """The first directory above `path` that others may not enter (pyenv's /root), or None."""
    parts = os.path.realpath(path).split(os.sep)[1:-1]
    for i in range(1, len(parts) + 1):
        above = os.sep + os.sep.join(parts[:i])
        if not os.stat(above).st_mode & stat.S_IXOTH:
            return above
    return None


def expose(paths) -> None:
    """As root, in its own mount namespace: a directory nobody may not enter that holds the Python installation
    is replaced by a tmpfs holding only copies of the installation's mounts, so nobody can read the installation
    and nothing else of it."""
    paths = {os.path.realpath(path) for path in paths}
    by_top = {}
    for path in paths:
        top = closed_ancestor(path)
        if top is not None and not any(path.startswith(other + os.sep) for other in paths):
            by_top.setdefault(top, []).append(path)
    for top, inner in by_top.items():
        copies = [(path, kernel.detached_copy(path)) for path in inner]
        kernel.mount("tmpfs", top, "tmpfs", kernel.MS_NOSUID | kernel.MS_NODEV, "size=65536,mode=0755")
        for path, fd in copies:
            os.makedirs(path, 0o755, exist_ok=True)
            kernel.attach_copy(fd, path)
            os.close(fd)
        kernel.read_only_tree(top)


def python_dirs_under_tmp() -> list:
    """The Python installation's directories the sandbox's /tmp would hide (a virtual environment under /tmp),
    outermost only."""
    dirs = {os.path.abspath(d) for d in python_dirs()}
    inside = [d for d in dirs if d.startswith(TMP + os.sep)]
    return sorted(d for d in inside if not any(d.startswith(other + os.sep) for other in inside))


def mount_tmp(options: str) -> None:
    """The tmpfs on /tmp, with copies of the Python installation's mounts under /tmp attached read-only where they
    were, so a virtual environment there stays importable and unwritable (copies taken before the tmpfs hides it)."""
    kept = []
    try:
        for path in python_dirs_under_tmp():
            kept.append((path, kernel.detached_copy(path)))
        kernel.mount("tmpfs", TMP, "tmpfs", kernel.MS_NOSUID | kernel.MS_NODEV, options)
        for path in (WORK, SHM):
            os.mkdir(path, 0o700)
        for path, fd in kept:
            os.makedirs(path, 0o755)
            kernel.attach_copy(fd, path)
            kernel.read_only_tree(path)
    finally:
        for _, fd in kept:
            os.close(fd)


def prepare_mounts(setup: Setup, disk_bytes: int) -> bool:
    """Host mounts read-only; a private tmpfs /tmp capped at `disk_bytes` holding the work directory (and, read-only,
    the Python installation's directories under /tmp), also mounted on /dev/shm. Returns whether /dev/shm is the
    sandbox's."""
    setup.attempt("read-only", kernel.read_only_tree, "/")
    options = f"size={disk_bytes},nr_inodes={max(1024, disk_bytes // 4096)},mode=0700"
    if not setup.attempt("tmpfs", mount_tmp, options):
        return False
    try:
        kernel.mount(SHM, "/dev/shm", None, kernel.MS_BIND)
    except OSError:
        return False
    return True


def enter_namespaces(setup: Setup, settings: dict) -> bool:
    """The new namespaces, then the mounts (as root: first the Python installation reachable, then nobody)."""
    uid, gid = os.geteuid(), os.getegid()
    as_nobody = uid == 0
    if as_nobody:
        unreadable = [d for d in python_dirs() if os.stat(d).st_mode & 0o005 != 0o005]
        if unreadable:
            as_nobody = False
            setup.missing["nproc"] = f"runs as root: nobody (65534) cannot read {unreadable[0]}"
    try:
        if as_nobody:
            kernel.unshare(kernel.CLONE_NEWNS)
            kernel.mount(None, "/", None, kernel.MS_REC | kernel.MS_PRIVATE)  # nothing propagates to the host
            expose(python_dirs())
            os.chown(settings["work"], NOBODY, NOBODY)  # its directory should the user namespace fail below
            os.setgroups([])
            os.setresgid(NOBODY, NOBODY, NOBODY)
            os.setresuid(NOBODY, NOBODY, NOBODY)
            kernel.prctl(kernel.PR_SET_DUMPABLE, 1)  # so that it may write its own uid_map
            uid = gid = NOBODY
        kernel.unshare(kernel.NAMESPACES)
    except OSError as err:
        setup.missing["namespaces"] = str(err)
        return False
    setup.layers.append("namespaces")
    try:
        kernel.map_ids(uid, gid)
        kernel.set_hostname("sandbox")
    except OSError as err:  # e.g. Ubuntu's AppArmor restriction: a user namespace without capabilities
        setup.missing["read-only"] = setup.missing["tmpfs"] = f"writing uid_map: {err}"
        return True
    settings["shm"] = prepare_mounts(setup, settings["disk_bytes"])
    return True


def become_init(setup: Setup, report_fd: int) -> int:
    """Fork C (PID 1 of the new namespace); R waits here and exits as G did. Returns, in C, the fd for G's
    wait status."""
    alive_r, alive_w = os.pipe()
    status_r, status_w = os.pipe()
    child = []
    signal.signal(signal.SIGTERM, lambda *_: child and os.kill(child[0], signal.SIGKILL))
    pid = os.fork()
    if pid:
        child.append(pid)
        for fd in (status_w, alive_r, report_fd):
            os.close(fd)
        _, wait_status = os.waitpid(pid, 0)  # returns once the namespace is empty
        reported = os.read(status_r, 32)
        exit_as(os.waitstatus_to_exitcode(int(reported) if reported else wait_status))
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    os.close(alive_w)
    os.close(status_r)
    kernel.prctl(kernel.PR_SET_PDEATHSIG, signal.SIGKILL)
    if select.select([alive_r], [], [], 0)[0]:  # R died before the line above: end of file
        os._exit(1)
    os.close(alive_r)
    setup.attempt("proc", kernel.mount, "proc", "/proc", "proc",
                  kernel.MS_RDONLY | kernel.MS_NOSUID | kernel.MS_NODEV | kernel.MS_NOEXEC)
    return status_w


def exit_as(code: int) -> None:
    """Exit as `code` (os.waitstatus_to_exitcode's: negative for a signal) said the code's process did."""
    if code < 0:
        try:
            signal.signal(-code, signal.SIG_DFL)
        except (OSError, ValueError):  # SIGKILL, SIGSTOP
            pass
        os.kill(os.getpid(), -code)
    os._exit(code if code >= 0 else 128 - code)


def reap_until_code_ends(status_w: int) -> None:
    """Fork G (returns in G); C reaps every orphan until G ends, hands R G's wait status and exits."""
    pid = os.fork()
    if pid == 0:
        os.close(status_w)
        return
    signal.signal(signal.SIGINT, signal.SIG_DFL)  # PID 1 ignores what the code sends it
    while True:
        try:
            done, wait_status = os.waitpid(-1, 0)
        except ChildProcessError:
            os._exit(1)
        if done == pid:
            os.write(status_w, str(wait_status).encode())
            os._exit(0)


def contain(setup: Setup, settings: dict, work: str, namespaced: bool) -> None:
    """Limits, then (unless containment is "audit-hook") capabilities off, Landlock, seccomp; report the layers
    on the status pipe; refuse ("full") when a required layer is missing."""
    nproc = None
    if namespaced and os.geteuid() != 0 and kernel_version() >= (5, 14):
        nproc = settings["processes"] + 2  # R and C are in the user namespace too
        setup.layers.append("nproc")
    elif "nproc" not in setup.missing:
        setup.missing["nproc"] = "needs the user namespace, a non-root user and Linux >= 5.14"
    memory, cpu, file_bytes = settings["memory"], settings["cpu"], settings["file_bytes"]
    limits = [(resource.RLIMIT_AS, memory, memory), (resource.RLIMIT_CPU, cpu, cpu + 1),  # SIGXCPU, then SIGKILL
              (resource.RLIMIT_FSIZE, file_bytes, file_bytes), (resource.RLIMIT_CORE, 0, 0)]
    for limit, soft, hard in limits + [(resource.RLIMIT_NPROC, nproc, nproc)] * (nproc is not None):
        ceiling = resource.getrlimit(limit)[1]  # the caller's own (`ulimit -v`): it may not be raised, only kept
        if ceiling != resource.RLIM_INFINITY:
            soft, hard = min(soft, ceiling), min(hard, ceiling)
        resource.setrlimit(limit, (soft, hard))
    if settings["mode"] != "audit-hook":
        if namespaced:
            kernel.drop_capabilities()
        rules = [(path, kernel.READ) for path in python_dirs() + list(SYSTEM)]
        rules += [("/proc", kernel.READ)] * ("proc" in setup.layers) + [("/dev/null", kernel.READ_WRITE_FILE)]
        writable = [TMP] + ["/dev/shm"] * bool(settings.get("shm")) if "tmpfs" in setup.layers else [work]
        rules += [(path, kernel.ALL) for path in writable]
        try:
            setup.layers += kernel.landlock(rules)
        except OSError as err:
            setup.missing["landlock"] = str(err)
        setup.attempt("seccomp", kernel.seccomp)
    if not namespaced:
        setup.layers.append("audit-hook")
    refused = settings["mode"] == "full" and any(layer not in setup.layers for layer in kernel.REQUIRED_LAYERS)
    report = {"layers": setup.layers, "missing": setup.missing, "refused": refused}
    os.write(settings["status_fd"], (json.dumps(report) + "\n").encode())
    os.close(settings["status_fd"])
    if refused:
        os._exit(125)


def kernel_version() -> tuple:
    major, minor = (os.uname().release.split("-")[0].split(".") + ["0"])[:2]
    return int(major), int("".join(c for c in minor if c.isdigit()) or 0)


def audit_hook(event, args):
    if event.startswith(BLOCKED):
        raise PermissionError(f"sandbox: {event} is blocked (no network, no new processes)")


def run_code(code: str, work: str, audited: bool) -> None:
    if work == WORK:  # else it is the caller's directory for it, already the current one
        os.chdir(work)
    path = "main.py"
    with open(path, "w", encoding="utf-8") as f:
        f.write(code)
    sys.argv = [path]
    if audited:
        sys.addaudithook(audit_hook)
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


def main() -> None:
    settings = json.loads(sys.argv[1])
    kernel.prctl(kernel.PR_SET_PDEATHSIG, signal.SIGKILL)  # R dies with the caller's thread that started it
    if os.getppid() != settings["parent"]:
        os._exit(1)
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    os.umask(0o022)
    with open(settings["code"], encoding="utf-8") as f:
        code = f.read()
    setup, work, namespaced = Setup(), settings["work"], False
    if settings["mode"] != "audit-hook":
        namespaced = enter_namespaces(setup, settings)
        if "tmpfs" in setup.layers:
            work = WORK
            os.environ.update(HOME=WORK, TMPDIR=TMP)
    status_w = become_init(setup, settings["status_fd"]) if namespaced else None
    contain(setup, settings, work, namespaced)
    if namespaced:
        reap_until_code_ends(status_w)
    run_code(code, work, audited=not namespaced)


if __name__ == "__main__":
    main()
