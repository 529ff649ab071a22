"""Every argument key the docs' tables name is exercised by the tests (issue 57): a test passes it (as a flag, a
keyword or an argument-file key), or a run's argument file that the tests run sets it (config/tiny, the PaddleNLP
and PaddleFormers fixtures). A documented key no test exercises fails here, naming the pages that document it."""
import glob
import os
import re

from alignment.config.argument_file import load_argument_file
from docsgen import claims
from tests.helpers import REPO

TABLE_ROW = re.compile(r"^\|([^|]*)\|")  # a Markdown table row's first cell


argument_keys = claims.argument_keys  # every field of every argument dataclass in alignment/config


REFERENCE = re.compile(r"<!-- generated: key-reference -->.*?<!-- end generated -->", re.S)


def documented(keys):
    """{key: pages} for the argument keys in backticks in the first cell of a table row of docs/. The generated
    configuration reference (docs/reference/config.md) lists every key because it exists, not because a page says
    what it does, so its table is not counted."""
    found = {}
    for page in sorted(glob.glob(os.path.join(REPO, "docs", "**", "*.md"), recursive=True)):
        with open(page, encoding="utf-8") as f:
            for line in REFERENCE.sub("", f.read()).splitlines():
                cell = TABLE_ROW.match(line)
                for name in re.findall(r"`([a-z][a-z0-9_]*)`", cell.group(1) if cell else ""):
                    if name in keys:
                        found.setdefault(name, set()).add(os.path.relpath(page, REPO))
    return found


def exercised(keys):
    """The keys some test passes, or some argument file the tests run sets."""
    text = "\n".join(open(path, encoding="utf-8").read()
                     for path in glob.glob(os.path.join(REPO, "tests", "**", "*.py"), recursive=True)
                     if os.path.basename(path) != os.path.basename(__file__))
    passed = {key for key in keys if re.search(rf"""["']--{key}["']|\b{key}=|["']{key}["']""", text)}
    files = glob.glob(os.path.join(REPO, "config", "tiny", "*_argument.*")) + \
        glob.glob(os.path.join(REPO, "tests", "fixtures", "paddle*", "*.*"))
    in_files = {key for path in files if path.endswith((".json", ".yaml")) and "expected" not in path
                for key in load_argument_file(path) if key in keys}
    return passed | in_files


def test_the_docs_tables_name_keys_and_every_one_is_exercised_by_a_test():
    keys = argument_keys()
    docs = documented(keys)
    assert len(docs) >= 20, "the docs' key tables were not found (has their layout changed?)"
    tested = exercised(keys)
    missing = {key: sorted(pages) for key, pages in docs.items() if key not in tested}
    assert not missing, f"documented keys no test exercises: {missing}"
