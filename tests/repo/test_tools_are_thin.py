"""tools/ holds command-line scripts only: benchmarks and tests import library code from the package, never from
tools/, and the scripts of the package's commands are a few lines running that command's `main()`."""
import ast
import os

import pytest

from tests.helpers import REPO


def imports_of_tools(source: str) -> list:
    """Line numbers of imports of `tools` or `tools.<x>`, by statement or by importlib.import_module("tools...")."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            names = [node.module or ""] if node.level == 0 else []
        elif isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", "")) == "import_module":
            first = node.args[0] if node.args else None
            if isinstance(first, ast.JoinedStr):
                first = first.values[0] if first.values else None
            names = [first.value] if isinstance(first, ast.Constant) and isinstance(first.value, str) else []
        else:
            continue
        if any(name == "tools" or name.startswith("tools.") for name in names):
            found.append(node.lineno)
    return found


def python_files(folder: str) -> list:
    return sorted(os.path.join(root, name) for root, _, names in os.walk(os.path.join(REPO, folder))
                  for name in names if name.endswith(".py"))


def test_the_scan_finds_every_way_of_importing_tools():
    source = ("import tools.predict\nfrom tools import plan_layout\nfrom tools.predict import load\n"
              "importlib.import_module('tools.make_tiny')\nimportlib.import_module(f'tools.{name}')\n"
              "from alignment.commands import predict\nimport toolsmith\nfrom . import tools\n")
    assert imports_of_tools(source) == [1, 2, 3, 4, 5]


@pytest.mark.parametrize("folder", ["tests", "benchmarks"])
def test_benchmarks_and_tests_do_not_import_from_tools(folder):
    offenders = {os.path.relpath(path, REPO): lines for path in python_files(folder)
                 for lines in [imports_of_tools(open(path, encoding="utf-8").read())] if lines}
    assert offenders == {}


def test_a_tool_with_a_command_in_the_package_only_runs_that_command():
    folder = os.path.join(REPO, "alignment", "commands")
    commands = {name[:-3] for name in os.listdir(folder) if name.endswith(".py") and name != "__init__.py"
                and "\ndef main(" in open(os.path.join(folder, name), encoding="utf-8").read()}  # helpers have none
    assert {"predict", "export_model", "judge_policy", "replay_ledger"} <= commands
    for name in sorted(commands):
        text = open(os.path.join(REPO, "tools", name + ".py"), encoding="utf-8").read()
        assert f"from alignment.commands.{name} import main" in text, name
        assert len(text.splitlines()) <= 20 and "def " not in text, name
