"""One run per output_dir: the main process holds an exclusive lock on `<output_dir>/.run.lock` for its whole life
(an OS file lock, released on any exit, so a lock left by a killed process is free again), and a fresh run does not
start over another run's checkpoints, metrics or arguments unless `overwrite_output_dir` says to remove them."""
from __future__ import annotations

import contextlib
import fcntl
import os
import re
import shutil
import socket
import sys
import time
from typing import IO, Dict, List

LOCK_FILE = ".run.lock"
_RUN_FILES = re.compile(r"^(checkpoint-\d+|latest|metrics\.jsonl|args\.json|\.checkpoint-\d+\.tmp-.*"
                        r"|visualdl|tensorboard|wandb|swanlog|mlflow\.db|mlartifacts|trackers\.json)$")  # trackers
_held: Dict[str, IO] = {}  # real path -> the open lock file of this process
_created: List[str] = []  # output_dirs this process made (removed again if the run fails before using them)


def claim_output_dir(args) -> None:
    """Make output_dir, lock it for this process, and refuse (or, with overwrite_output_dir, clear) another run's
    files there. Raises ValueError naming the key. If the program then fails, however it fails, the lock file and
    the output_dir if it was made here and left empty go again (alignment/exits.py's on_failure)."""
    from alignment.exits import on_failure

    on_failure(release_output_dirs_after_failure)
    path = args.output_dir
    if not path:
        raise ValueError("key 'output_dir' is empty")
    if os.path.exists(path) and not os.path.isdir(path):
        raise ValueError(f"key 'output_dir': {path} is a file, not a directory")
    try:
        if not os.path.exists(path):
            os.makedirs(path)
            _created.append(os.path.realpath(path))
    except OSError as err:
        raise ValueError(f"key 'output_dir': cannot create {path} ({err.strerror})") from None
    real = os.path.realpath(path)
    if real not in _held:
        _held[real] = _lock(real)
    previous = previous_run_files(real, _logging_folder(args))
    if not previous or args.resume_from_checkpoint is not None:
        return
    if not args.overwrite_output_dir:
        raise ValueError(f"key 'output_dir': {path} holds another run ({', '.join(previous[:4])}"
                         f"{', ...' if len(previous) > 4 else ''}); continue it with resume_from_checkpoint: auto, "
                         f"replace it with overwrite_output_dir: true, or choose another output_dir")
    for name in previous:
        full = os.path.join(real, name)
        shutil.rmtree(full) if os.path.isdir(full) else os.remove(full)


def release_output_dir(path: str) -> None:
    """Give up this process's lock on `path` (a library user starting another run in the same process later
    does not need it; the lock is otherwise held until the process exits)."""
    lock = _held.pop(os.path.realpath(path), None)
    if lock is not None:
        lock.close()


def release_output_dirs_after_failure() -> None:
    """For a run that fails: its lock files are removed (the process is ending; nothing is left that says a run is
    there), and the output_dirs it created and left empty with them, so bad input leaves no trace."""
    for real in list(_held):
        _held.pop(real).close()
        with contextlib.suppress(FileNotFoundError):
            os.remove(os.path.join(real, LOCK_FILE))
    for real in list(_created):
        with contextlib.suppress(OSError):  # not empty: the run wrote something (kept)
            os.rmdir(real)
        _created.remove(real)


def previous_run_files(path: str, also=()) -> List[str]:
    return sorted(name for name in os.listdir(path) if _RUN_FILES.match(name) or name in also)


def _logging_folder(args) -> tuple:
    """The folder under output_dir that a relative logging_dir puts the trackers' files in (a run's files)."""
    logging_dir = getattr(args, "logging_dir", None)
    if not logging_dir or os.path.isabs(logging_dir):
        return ()
    first = os.path.normpath(logging_dir).split(os.sep)[0]
    return () if first in (".", "..") else (first,)


def _lock(path: str) -> IO:
    lock_path = os.path.join(path, LOCK_FILE)
    try:
        lock = open(lock_path, "a+", encoding="utf-8")
    except OSError as err:
        raise ValueError(f"key 'output_dir': {path} is not writable ({err.strerror})") from None
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        lock.seek(0)
        holder = lock.read().strip() or "a process that has not written its name yet"
        lock.close()
        raise ValueError(f"key 'output_dir': {path} is in use by another run ({holder}); wait for it to end or "
                         f"choose another output_dir") from None
    try:
        lock.seek(0)
        lock.truncate()
        lock.write(f"pid {os.getpid()} on {socket.gethostname()}, started {time.strftime('%Y-%m-%d %H:%M:%S')}: "
                   f"{' '.join(sys.argv)[:300]}\n")
        lock.flush()
    except OSError as err:
        lock.close()
        raise ValueError(f"key 'output_dir': cannot write in {path} ({err.strerror})") from None
    return lock
