"""The shell blocks of the docs that a test runs: a ```bash fence whose first line is `# runnable` (quick: the
default suite) or `# runnable: slow` (the slow suite). Other shell blocks are shown, not run."""
from __future__ import annotations

import glob
import os
import re
from typing import List, NamedTuple

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FENCE = re.compile(r"^(?P<indent>[ \t]*)```bash\n(?P<body>.*?)^(?P=indent)```", re.S | re.M)


class Block(NamedTuple):
    page: str   # docs-relative path
    line: int   # the fence's line number
    slow: bool
    script: str

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
            if first in ("# runnable", "# runnable: slow"):
                found.append(Block(os.path.relpath(page, docs), text[:match.start()].count("\n") + 1,
                                   first.endswith("slow"), "\n".join(lines[1:]) + "\n"))
    return found
