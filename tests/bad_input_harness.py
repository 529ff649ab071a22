"""How the bad-input catalogues (tests/config/test_bad_inputs_*.py) run a case: build its inputs under tmp_path, run the
program in this process as its console command would (alignment/exits.py's run_program), and check what the
house rule asks of every bad input: exit 2, one `error:` line naming the input, no traceback, and nothing written
(no file or directory under tmp_path created, changed or removed). A case that could crash or hang the process
(a C library reading a hostile file) runs in a child process instead."""
import json
import os
import subprocess
import sys
from typing import Callable, NamedTuple, Sequence

from alignment.exits import run_program
from tests.helpers import REPO


class Case(NamedTuple):
    id: str
    build: Callable  # (tmp_path, tiny model dir) -> a program: main() to run in-process, or an argv list (child)
    fragments: Sequence[str]  # what the one error line must contain (the file, line, key, the problem)


def case(id: str, build: Callable, *fragments: str) -> Case:
    return Case(id, build, fragments)


def snapshot(root) -> dict:
    """{relative path: (size, mtime)} of everything under root (directories too)."""
    found = {}
    for folder, dirs, files in os.walk(root):
        for name in dirs + files:
            path = os.path.join(folder, name)
            stat = os.lstat(path)
            found[os.path.relpath(path, root)] = (stat.st_size if name in files else -1, stat.st_mtime_ns)
    return found


def run_case(case: Case, tmp_path, model_dir, capsys) -> str:
    """Run one case and assert the rule; return the error line."""
    program = case.build(tmp_path, model_dir)
    before = snapshot(tmp_path)
    if callable(program):
        capsys.readouterr()
        code = run_program(program, uses_paddle=False)  # paddle is imported already (and its handlers installed)
        err = capsys.readouterr().err
    else:
        env = {**os.environ, "PYTHONPATH": REPO}
        env.pop("ALIGNMENT_DEBUG", None)
        done = subprocess.run([sys.executable, *program], cwd=REPO, env=env, capture_output=True, text=True,
                              timeout=60)
        code, err = done.returncode, done.stderr
    lines = [line for line in err.strip().splitlines() if line.strip()]
    assert code == 2 and len(lines) == 1 and lines[0].startswith("error: "), (code, err[-2000:])
    assert "Traceback" not in err
    for fragment in case.fragments:
        assert fragment in lines[0], f"{fragment!r} not in {lines[0]!r}"
    after = snapshot(tmp_path)
    assert after == before, f"written: {sorted(set(after.items()) ^ set(before.items()))[:5]}"
    return lines[0]


def write(path, content) -> str:
    """Write str / bytes / a JSON value (anything else) to path; return it as a string."""
    path = os.fspath(path)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    data = content if isinstance(content, bytes) else (
        content if isinstance(content, str) else json.dumps(content)).encode("utf-8", "surrogatepass")
    with open(path, "wb") as f:
        f.write(data)
    return path


def lines(path, rows) -> str:
    """A JSONL file of rows (a dict dumped as JSON, str / bytes written as they are)."""
    parts = [r if isinstance(r, bytes) else (r if isinstance(r, str) else json.dumps(r)).encode("utf-8",
                                                                                              "surrogatepass")
             for r in rows]
    return write(path, b"\n".join(parts) + b"\n")
