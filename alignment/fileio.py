"""Crash-safe writes: build outputs in a temporary sibling, fsync, then rename into place.

A process killed mid-save leaves either the old complete output or the new complete one, never a half-written
checkpoint (at worst a `.tmp-*` sibling, removed by the next save of the same path).
"""
from __future__ import annotations

import contextlib
import ctypes
import glob
import json
import os
import shutil
import tempfile


def _fsync_tree(path: str) -> None:
    """fsync every file under `path`, giving each the permissions a plain open() would (some writers, such as
    safetensors, create 0600 temporary files that a serving container or a colleague could not read)."""
    file_mode, dir_mode = 0o666 & ~_umask(), 0o777 & ~_umask()
    for root, dirs, files in os.walk(path):
        for name in dirs:
            os.chmod(os.path.join(root, name), dir_mode)
        for name in files:
            os.chmod(os.path.join(root, name), file_mode)
            with open(os.path.join(root, name), "rb") as f:
                os.fsync(f.fileno())
    _fsync_dir(path)


def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _exchange(a: str, b: str) -> bool:
    """Swap two existing paths in one atomic step (Linux renameat2 RENAME_EXCHANGE); False where the C library
    or the filesystem cannot."""
    try:
        renameat2 = ctypes.CDLL(None, use_errno=True).renameat2
    except (OSError, AttributeError):
        return False
    at_fdcwd, rename_exchange = -100, 2
    return renameat2(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange) == 0


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def recover_directory(path: str) -> None:
    """Put back the previous copy of `path` if a replacement was cut between its two renames (see below)."""
    parent, base = os.path.dirname(os.path.abspath(path)), os.path.basename(os.path.abspath(path))
    for old in glob.glob(os.path.join(parent, f".{base}.tmp-old-*")):
        if not os.path.exists(path) and os.path.isdir(os.path.join(old, base)):
            os.rename(os.path.join(old, base), path)


@contextlib.contextmanager
def atomic_directory(path: str):
    """Yield a temporary directory; on success it replaces `path` whole. On an exception nothing changes.
    An existing `path` is swapped with the new copy in one atomic exchange where Linux allows it; elsewhere it is
    renamed aside first, and a kill between the two renames is undone by recover_directory (called here first)."""
    path = os.path.abspath(path)
    parent = os.path.dirname(path)
    os.makedirs(parent, exist_ok=True)
    base = os.path.basename(path)
    recover_directory(path)
    for stale in glob.glob(os.path.join(parent, f".{base}.tmp-*")):
        shutil.rmtree(stale, ignore_errors=True)
    tmp = tempfile.mkdtemp(prefix=f".{base}.tmp-", dir=parent)
    os.chmod(tmp, 0o777 & ~_umask())  # mkdtemp's 0700 would hide the result from other users and containers
    try:
        yield tmp
        _fsync_tree(tmp)
        if not os.path.exists(path):
            os.rename(tmp, path)
        elif _exchange(tmp, path):
            shutil.rmtree(tmp, ignore_errors=True)  # now the previous copy
        else:
            old = tempfile.mkdtemp(prefix=f".{base}.tmp-old-", dir=parent)
            os.rename(path, os.path.join(old, base))
            os.rename(tmp, path)
            shutil.rmtree(old, ignore_errors=True)
        _fsync_dir(parent)
    except BaseException:
        recover_directory(path)
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def write_text_atomic(path: str, text: str) -> None:
    """Write `text` to `path` via a temporary file in the same directory, fsync, then rename."""
    parent = os.path.dirname(os.path.abspath(path))
    os.makedirs(parent, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp's 0600 would hide it from other users
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise


def write_json_atomic(path: str, data, indent: int = 2) -> None:
    """Write JSON to `path` via a temporary file and rename."""
    write_text_atomic(path, json.dumps(data, indent=indent, sort_keys=True, default=str) + "\n")


class OutputExists(ValueError):
    """An output path names something this program did not write (a ValueError: bad input, exit 2)."""


def refuse_to_replace(path: str, overwrite: bool, flag: str = "--overwrite to replace it", ours=None) -> None:
    """Stop before writing `path` when something is there already - a file, a link, a directory that is not empty -
    unless `overwrite` (the user's `flag`) or `ours(path)` (this program wrote it before) says it may go."""
    if overwrite or not os.path.lexists(path):
        return
    if os.path.isdir(path) and not os.path.islink(path) and not os.listdir(path):
        return
    if ours is not None and ours(path):
        return
    kind = "directory" if os.path.isdir(path) and not os.path.islink(path) else "file"
    raise OutputExists(f"{path}: an existing {kind}; give a new path, or {flag}")
