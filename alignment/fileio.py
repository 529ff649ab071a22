"""Crash-safe writes: build outputs in a temporary sibling, fsync, then rename into place.

A process killed mid-save leaves either the old complete output or the new complete one, never a half-written
checkpoint (at worst a `.tmp-*` sibling, removed by the next save of the same path).
"""
from __future__ import annotations

import contextlib
import glob
import json
import os
import shutil
import tempfile


def _fsync_tree(path: str) -> None:
    for root, _, files in os.walk(path):
        for name in files:
            with open(os.path.join(root, name), "rb") as f:
                os.fsync(f.fileno())
    _fsync_dir(path)


def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@contextlib.contextmanager
def atomic_directory(path: str):
    """Yield a temporary directory; on success it replaces `path` whole. On an exception nothing changes."""
    path = os.path.abspath(path)
    parent = os.path.dirname(path)
    os.makedirs(parent, exist_ok=True)
    base = os.path.basename(path)
    for stale in glob.glob(os.path.join(parent, f".{base}.tmp-*")):
        shutil.rmtree(stale, ignore_errors=True)
    tmp = tempfile.mkdtemp(prefix=f".{base}.tmp-", dir=parent)
    try:
        yield tmp
        _fsync_tree(tmp)
        if os.path.exists(path):
            old = tempfile.mkdtemp(prefix=f".{base}.tmp-old-", dir=parent)
            os.rename(path, os.path.join(old, base))
            os.rename(tmp, path)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.rename(tmp, path)
        _fsync_dir(parent)
    except BaseException:
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
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise


def write_json_atomic(path: str, data, indent: int = 2) -> None:
    """Write JSON to `path` via a temporary file and rename."""
    write_text_atomic(path, json.dumps(data, indent=indent, sort_keys=True, default=str) + "\n")
