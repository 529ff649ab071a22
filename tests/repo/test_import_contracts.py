"""The one-way layers of .importlinter hold, and a wrong-way import really breaks them (the contracts can fail)."""
import os
import shutil
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
LINT = [sys.executable, "-c", "import sys; from importlinter.cli import lint_imports_command; "
                              "sys.exit(lint_imports_command())", "--no-cache"]


def lint(cwd):
    return subprocess.run(LINT, cwd=cwd, capture_output=True, text=True, timeout=300)


def test_the_import_contracts_hold():
    result = lint(REPO)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Contracts: 8 kept, 0 broken." in result.stdout


@pytest.mark.parametrize("module, line, broken", [
    ("alignment/models/llama.py", "from alignment.ppo.rl_math import algorithms", "alignment.models is not allowed "
                                                                                  "to import alignment.ppo"),
    ("alignment/models/lora.py", "from alignment.models.checkpoint import load_weights", "No cycles are allowed "
                                                                                           "in alignment.models"),
    ("alignment/ppo/rl_math/algorithms.py", "import numpy", "alignment.ppo.rl_math is not allowed to import numpy"),
    ("alignment/sft/sft_trainer.py", "from alignment.dpo import losses", "alignment.sft is not allowed to import "
                                                                         "alignment.dpo"),
    ("alignment/config/training.py", "import paddle", "alignment.config is not allowed to import paddle"),
    ("alignment/planning/memory.py", "import paddle", "alignment.planning is not allowed to import paddle"),
    ("alignment/inference/export.py", "from alignment.training import setup", "alignment.inference is not allowed "
                                                                              "to import alignment.training"),
    ("alignment/rewards/scoring.py", "from alignment.commands import plot_run", "alignment.rewards is not allowed "
                                                                                "to import alignment.commands"),
])
def test_a_wrong_way_import_breaks_a_contract(tmp_path, module, line, broken):
    """Imports hidden inside functions count too."""
    shutil.copytree(os.path.join(REPO, "alignment"), tmp_path / "alignment",
                    ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(os.path.join(REPO, ".importlinter"), tmp_path / ".importlinter")
    with open(tmp_path / module, "a", encoding="utf-8") as f:
        f.write(f"\n\ndef _deliberately_wrong():\n    {line}  # noqa\n")
    result = lint(tmp_path)
    assert result.returncode == 1, result.stdout
    assert broken in result.stdout, result.stdout
