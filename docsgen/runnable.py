"""The shell blocks of the docs that a test runs: a ```bash fence whose first line is `# runnable` (quick: the
default suite), `# runnable: slow` (the slow suite) or `# runnable: by tests/<folder>/<file>.py` (that test runs the
block itself, through `block_on(page)`, as part of a check of its own: the smoke run that the reproducibility test runs
twice is not run a third time). Other shell blocks are shown, not run."""
from __future__ import annotations

import glob
import os
import re
from typing import List, NamedTuple, Optional

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FENCE = re.compile(r"^(?P<indent>[ \t]*)```bash\n(?P<body>.*?)^(?P=indent)```", re.S | re.M)


class Block(NamedTuple):
    page: str   # docs-relative path
    line: int   # the fence's line number
    slow: bool
    script: str
    by: Optional[str] = None  # the test file that runs it (`# runnable: by tests/...py`), else None

    @property
    def id(self) -> str:
        return f"{self.page}:{self.line}"


def blocks(docs: str = os.path.join(REPO, "docs")) -> List[Block]:
    found = []
    for page in sorted(glob.glob(os.path.join(docs, "**", "*.md"), recursive=True)):
        with open(page, encoding="utf-8") as f:
            text = f.read()
        for match in FENCE.finditer(text):
            lines = [line[len(match.group("indent")):] for line in match.group("body").splitlines()]
            first = lines[0].strip() if lines else ""
            by = first[len("# runnable: by "):].strip() if first.startswith("# runnable: by ") else None
            if first in ("# runnable", "# runnable: slow") or by:
                found.append(Block(os.path.relpath(page, docs), text[:match.start()].count("\n") + 1,
                                   first.endswith("slow"), "\n".join(lines[1:]) + "\n", by))
    return found


def block_on(page: str, by: str, docs: str = os.path.join(REPO, "docs")) -> Block:
    """The one block of docs page `page` that test file `by` runs (`# runnable: by <by>`)."""
    found = [block for block in blocks(docs) if block.page == page and block.by == by]
    if len(found) != 1:
        raise LookupError(f"{page}: {len(found)} blocks marked '# runnable: by {by}', expected 1")
    return found[0]
