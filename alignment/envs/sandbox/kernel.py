"""What an unprivileged Linux process can do to contain itself, through ctypes: namespaces and mounts, Landlock,
seccomp, dropping capabilities. Used by the python sandbox's child (child.py), so standard library only;
x86_64 and aarch64. Every call raises OSError naming the call when the kernel refuses it."""
from __future__ import annotations

import ctypes
import errno
import os
import stat

libc = ctypes.CDLL(None, use_errno=True)

# The layers a "full" containment needs (child.py applies them; runner.py refuses to run without them).
REQUIRED_LAYERS = ("namespaces", "read-only", "tmpfs", "nproc", "landlock", "seccomp")

CLONE_NEWNS, CLONE_NEWIPC, CLONE_NEWUSER = 0x00020000, 0x08000000, 0x10000000
CLONE_NEWPID, CLONE_NEWNET, CLONE_NEWUTS, CLONE_NEWCGROUP = 0x20000000, 0x40000000, 0x04000000, 0x02000000
NAMESPACES = CLONE_NEWUSER | CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWIPC | CLONE_NEWNET | CLONE_NEWUTS | CLONE_NEWCGROUP
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_BIND, MS_REC, MS_PRIVATE = 1, 2, 4, 8, 4096, 16384, 1 << 18
PR_SET_PDEATHSIG, PR_SET_DUMPABLE, PR_SET_NO_NEW_PRIVS = 1, 4, 38
_AT_FDCWD, _AT_RECURSIVE, _OPEN_TREE_CLONE, _MOVE_MOUNT_F_EMPTY_PATH = -100, 0x8000, 1, 4
_MOUNT_SETATTR, _OPEN_TREE, _MOVE_MOUNT = 442, 428, 429  # the same number on every architecture since 5.x
_LANDLOCK_CREATE_RULESET, _LANDLOCK_ADD_RULE, _LANDLOCK_RESTRICT_SELF = 444, 445, 446


def _checked(result: int, what: str) -> int:
    if result == -1:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")
    return result


def _syscall(number: int, *args) -> int:
    return libc.syscall(ctypes.c_long(number), *(ctypes.c_long(a) if isinstance(a, int) else a for a in args))


def _path(text):
    return None if text is None else os.fsencode(text)


def prctl(option: int, value: int) -> None:
    _checked(libc.prctl(option, ctypes.c_ulong(value), ctypes.c_ulong(0), ctypes.c_ulong(0), ctypes.c_ulong(0)),
             f"prctl({option})")


def unshare(flags: int) -> None:
    _checked(libc.unshare(flags), "unshare")


def set_hostname(name: str) -> None:
    """In a new UTS namespace: the machine's name is not the code's business."""
    _checked(libc.sethostname(name.encode(), len(name)), "sethostname")


def map_ids(uid: int, gid: int) -> None:
    """Inside a new user namespace: the one outside id is itself inside, supplementary groups off."""
    for name, text in (("setgroups", "deny"), ("uid_map", f"{uid} {uid} 1"), ("gid_map", f"{gid} {gid} 1")):
        with open(f"/proc/self/{name}", "w") as f:
            f.write(text)


def mount(source, target, fstype, flags: int, data=None) -> None:
    _checked(libc.mount(_path(source), _path(target), _path(fstype), ctypes.c_ulong(flags), _path(data)),
             f"mount {target}")


class _MountAttr(ctypes.Structure):
    _fields_ = [("attr_set", ctypes.c_uint64), ("attr_clr", ctypes.c_uint64), ("propagation", ctypes.c_uint64),
                ("userns_fd", ctypes.c_uint64)]


def read_only_tree(path: str) -> None:
    """Every mount at and under `path` read-only and nosuid, and private (nothing propagates back)."""
    attr = _MountAttr(0x1 | 0x2, 0, MS_PRIVATE, 0)  # MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID
    _checked(_syscall(_MOUNT_SETATTR, _AT_FDCWD, _path(path), _AT_RECURSIVE, ctypes.byref(attr),
                      ctypes.sizeof(attr)), f"mount_setattr {path}")


def detached_copy(path: str) -> int:
    """A file descriptor holding a copy of the mount tree at `path`, to attach elsewhere (attach_copy)."""
    return _checked(_syscall(_OPEN_TREE, _AT_FDCWD, _path(path), _OPEN_TREE_CLONE | _AT_RECURSIVE | os.O_CLOEXEC),
                    f"open_tree {path}")


def attach_copy(fd: int, target: str) -> None:
    _checked(_syscall(_MOVE_MOUNT, fd, b"", _AT_FDCWD, _path(target), _MOVE_MOUNT_F_EMPTY_PATH),
             f"move_mount {target}")


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]


def drop_capabilities() -> None:
    """No capability left (those a new user namespace gives its creator included; ambient ones follow)."""
    _checked(libc.capset(ctypes.byref(_CapHeader(0x20080522, 0)), (_CapData * 2)()), "capset")


# --------------------------------------------------------------------------- Landlock
# (docs.kernel.org/userspace-api/landlock.html)

_FS_EXECUTE, _FS_WRITE_FILE, _FS_READ_FILE, _FS_READ_DIR = 1, 2, 4, 8
_FS_TRUNCATE, _FS_IOCTL_DEV = 1 << 14, 1 << 15
_FS_FILE_RIGHTS = _FS_EXECUTE | _FS_WRITE_FILE | _FS_READ_FILE | _FS_TRUNCATE | _FS_IOCTL_DEV
READ = _FS_EXECUTE | _FS_READ_FILE | _FS_READ_DIR
READ_WRITE_FILE = _FS_READ_FILE | _FS_WRITE_FILE | _FS_TRUNCATE
ALL = (1 << 16) - 1  # trimmed to what the kernel's ABI handles


def _handled_fs(abi: int) -> int:
    """ABI 1: 13 rights (execute .. make_sym); 2: + refer; 3: + truncate; 5: + ioctl_dev."""
    return (1 << 13) - 1 | (1 << 13 if abi >= 2 else 0) | (_FS_TRUNCATE if abi >= 3 else 0) \
        | (_FS_IOCTL_DEV if abi >= 5 else 0)


class _RulesetAttr(ctypes.Structure):
    _fields_ = [("handled_access_fs", ctypes.c_uint64), ("handled_access_net", ctypes.c_uint64),
                ("scoped", ctypes.c_uint64)]  # the larger struct is accepted by older kernels when zero-filled


class _PathBeneath(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


def landlock_abi() -> int:
    """The kernel's Landlock ABI version; OSError ENOSYS (no Landlock) or EOPNOTSUPP (built in, not enabled)."""
    return _checked(_syscall(_LANDLOCK_CREATE_RULESET, None, 0, 1), "landlock")


def landlock(rules) -> list:
    """Restrict this process and its children to `rules` ((path, rights) pairs; a path that does not exist is
    skipped): no other file may be opened, created, removed, renamed or executed; with ABI 4 no TCP bind or
    connect; with ABI 6 no signal to and no abstract unix socket of a process outside. Returns what applied."""
    abi = landlock_abi()
    handled = _handled_fs(abi)
    attr = _RulesetAttr(handled, 0b11 if abi >= 4 else 0, 0b11 if abi >= 6 else 0)
    ruleset = _checked(_syscall(_LANDLOCK_CREATE_RULESET, ctypes.byref(attr), ctypes.sizeof(attr), 0), "landlock")
    try:
        for path, rights in rules:
            try:
                fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
            except FileNotFoundError:
                continue
            try:
                allowed = rights & handled & (ALL if stat.S_ISDIR(os.fstat(fd).st_mode) else _FS_FILE_RIGHTS)
                rule = _PathBeneath(allowed, fd)
                _checked(_syscall(_LANDLOCK_ADD_RULE, ruleset, 1, ctypes.byref(rule), 0), f"landlock rule {path}")
            finally:
                os.close(fd)
        prctl(PR_SET_NO_NEW_PRIVS, 1)
        _checked(_syscall(_LANDLOCK_RESTRICT_SELF, ruleset, 0), "landlock_restrict_self")
    finally:
        os.close(ruleset)
    return ["landlock"] + ["landlock-net"] * (abi >= 4) + ["landlock-scope"] * (abi >= 6)


# --------------------------------------------------------------------------- seccomp

# name: (x86_64, aarch64). Refused with EPERM: debugging other processes, kernel keyrings, eBPF, perf, mounts and
# new namespaces (after the set-up), io_uring (it bypasses the other syscall checks), userfaultfd, modules, kexec,
# file handles, and the rest only an administrator needs.
_DENIED = {
    "ptrace": (101, 117), "process_vm_readv": (310, 270), "process_vm_writev": (311, 271), "kcmp": (312, 272),
    "pidfd_getfd": (438, 438), "process_madvise": (440, 440), "keyctl": (250, 219), "add_key": (248, 217),
    "request_key": (249, 218), "bpf": (321, 280), "perf_event_open": (298, 241), "userfaultfd": (323, 282),
    "mount": (165, 40), "umount2": (166, 39), "pivot_root": (155, 41), "chroot": (161, 51),
    "unshare": (272, 97), "setns": (308, 268), "open_tree": (428, 428), "move_mount": (429, 429),
    "fsopen": (430, 430), "fsconfig": (431, 431), "fsmount": (432, 432), "fspick": (433, 433),
    "mount_setattr": (442, 442), "open_tree_attr": (467, 467), "io_uring_setup": (425, 425),
    "io_uring_enter": (426, 426), "io_uring_register": (427, 427), "kexec_load": (246, 104),
    "kexec_file_load": (320, 294), "init_module": (175, 105), "finit_module": (313, 273),
    "delete_module": (176, 106), "acct": (163, 89), "swapon": (167, 224), "swapoff": (168, 225),
    "reboot": (169, 142), "name_to_handle_at": (303, 264), "open_by_handle_at": (304, 265),
    "fanotify_init": (300, 262), "syslog": (103, 116), "quotactl": (179, 60), "lookup_dcookie": (212, 18),
}
_CLONE, _CLONE3, _SOCKET = {"x86_64": 56, "aarch64": 220}, 435, {"x86_64": 41, "aarch64": 198}
_AUDIT_ARCH = {"x86_64": 0xC000003E, "aarch64": 0xC00000B7}
_NEW_NAMESPACE_FLAGS = (CLONE_NEWNS | CLONE_NEWIPC | CLONE_NEWUSER | CLONE_NEWPID | CLONE_NEWNET | CLONE_NEWUTS
                        | CLONE_NEWCGROUP)
_AF_INET, _AF_INET6 = 2, 10  # inert in the empty network namespace; unix, netlink, vsock ... sockets are refused
_LD, _JEQ, _JGE, _JSET, _RET = 0x20, 0x15, 0x35, 0x45, 0x06  # BPF_LD|W|ABS, BPF_JMP|JEQ|K, ..., BPF_RET|K
_ALLOW, _KILL_PROCESS, _ERRNO = 0x7FFF0000, 0x80000000, 0x00050000


class _SockFilter(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint16), ("jt", ctypes.c_uint8), ("jf", ctypes.c_uint8), ("k", ctypes.c_uint32)]


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(_SockFilter))]


def seccomp_program(machine: str) -> list:
    """The filter as (code, jt, jf, k) BPF instructions over seccomp_data (nr at 0, arch at 4, args from 16)."""
    if machine not in _AUDIT_ARCH:
        raise OSError(errno.ENOSYS, f"seccomp: no syscall table for {machine}")
    column = 0 if machine == "x86_64" else 1
    eperm = _ERRNO | errno.EPERM
    program = [(_LD, 0, 0, 4), (_JEQ, 1, 0, _AUDIT_ARCH[machine]), (_RET, 0, 0, _KILL_PROCESS), (_LD, 0, 0, 0)]
    if machine == "x86_64":  # the x32 ABI's numbers
        program += [(_JGE, 0, 1, 0x40000000), (_RET, 0, 0, eperm)]
    for numbers in _DENIED.values():
        program += [(_JEQ, 0, 1, numbers[column]), (_RET, 0, 0, eperm)]
    program += [(_JEQ, 0, 1, _CLONE3), (_RET, 0, 0, _ERRNO | errno.ENOSYS),  # its flags are behind a pointer:
                (_JEQ, 0, 4, _CLONE[machine]), (_LD, 0, 0, 16),           # libc falls back to clone
                (_JSET, 0, 1, _NEW_NAMESPACE_FLAGS), (_RET, 0, 0, eperm), (_RET, 0, 0, _ALLOW),
                (_JEQ, 0, 5, _SOCKET[machine]), (_LD, 0, 0, 16), (_JEQ, 2, 0, _AF_INET), (_JEQ, 1, 0, _AF_INET6),
                (_RET, 0, 0, eperm), (_RET, 0, 0, _ALLOW), (_RET, 0, 0, _ALLOW)]
    return program


def seccomp() -> None:
    """Install the filter (sets no_new_privs; the process must be single-threaded)."""
    program = seccomp_program(os.uname().machine)
    filters = (_SockFilter * len(program))(*(_SockFilter(*instruction) for instruction in program))
    prctl(PR_SET_NO_NEW_PRIVS, 1)
    fprog = _SockFprog(len(program), filters)
    _checked(libc.prctl(22, ctypes.c_ulong(2), ctypes.byref(fprog), ctypes.c_ulong(0), ctypes.c_ulong(0)),
             "seccomp")  # PR_SET_SECCOMP, SECCOMP_MODE_FILTER
