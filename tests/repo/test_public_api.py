"""The extension points are imported from `alignment` (alignment/__init__.py): each name is the object its home
module defines, `import alignment` loads no Paddle, and the docs and examples import them from there, not from
the module they happen to live in."""
import glob
import importlib
import os
import re
import subprocess
import sys

import pytest

import alignment
from tests.helpers import REPO

FROM_SUBMODULE = re.compile(r"^\s*from (alignment\.[\w.]+) import \(?([\w, ]+)\)?")


@pytest.mark.parametrize("name", alignment.__all__)
def test_each_public_name_is_its_home_modules_object(name):
    home = importlib.import_module(alignment._HOMES[name])
    assert getattr(alignment, name) is getattr(home, name)


def test_an_unknown_name_is_an_attribute_error():
    with pytest.raises(AttributeError, match="no attribute 'NotThere'"):
        alignment.NotThere  # noqa: B018


def test_importing_the_extension_points_of_data_envs_and_evaluation_loads_no_paddle():
    code = ("import sys; from alignment import RawDataset, Environment, StepResult, tool_schema, EvalTask, "
            "REWARD_FUNCTIONS, SandboxLimits, run_python; print('paddle' in sys.modules)")
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0 and result.stdout.strip() == "False", result.stderr[-800:]


def public_imports_from_submodules(text: str):
    """(line number, line) of each `from alignment.x import NAME` where NAME is public."""
    for number, line in enumerate(text.splitlines(), 1):
        match = FROM_SUBMODULE.match(line)
        if match and {n.strip() for n in match.group(2).split(",")} & set(alignment.__all__):
            yield number, line.strip()


def test_the_docs_and_examples_import_the_extension_points_from_alignment():
    files = [*glob.glob(os.path.join(REPO, "docs", "**", "*.md"), recursive=True),
             *glob.glob(os.path.join(REPO, "examples", "**", "*.py"), recursive=True),
             os.path.join(REPO, "README.md")]
    assert len(files) > 50
    found = [f"{os.path.relpath(path, REPO)}:{number}: {line}" for path in files
             for number, line in public_imports_from_submodules(open(path, encoding="utf-8").read())]
    assert not found, "import these from `alignment`:\n" + "\n".join(found)


def test_the_check_sees_a_page_that_imports_from_a_submodule():
    page = "```python\nfrom alignment.data import RawDataset\nfrom alignment.models import Tokenizer\n```\n"
    assert list(public_imports_from_submodules(page)) == [(2, "from alignment.data import RawDataset")]
