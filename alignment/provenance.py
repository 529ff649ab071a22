"""Where a result came from: the checkout's commit, the machine (alignment.cpu_env.machine_facts) and the command,
written at the head of every result file (benchmarks/record.py, evaluation summaries). No paddle import."""
from __future__ import annotations

import datetime
import os
import subprocess
import sys
from typing import Dict, Optional

CHECKOUT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def git_commit(repo: str = CHECKOUT) -> str:
    """The checkout's commit, with `+changes` when the tracked files differ from it (the run measured those)."""
    try:
        head = subprocess.run(["git", "rev-parse", "--short=7", "HEAD"], cwd=repo, capture_output=True, text=True,
                              check=True, timeout=30).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=repo,
                               capture_output=True, text=True, check=True, timeout=30).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return head + ("+changes" if dirty else "")


def result_header(kind: str, when: Optional[datetime.datetime] = None) -> Dict[str, object]:
    """{benchmark, date, commit, machine, command} for a result of `kind`."""
    from alignment.cpu_env import machine_facts

    when = when or datetime.datetime.now(datetime.timezone.utc)
    command = " ".join(["python", os.path.relpath(sys.argv[0], CHECKOUT) if sys.argv and sys.argv[0] else "-"]
                       + sys.argv[1:])
    return {"benchmark": kind, "date": when.strftime("%Y-%m-%d %H:%M UTC"), "commit": git_commit(),
            "machine": machine_facts(), "command": command}
