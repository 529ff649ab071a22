"""Small files: every module of the package stays at most 350 lines (split by concept beyond that)."""
import os

from tests.helpers import REPO

LIMIT = 350


def test_every_package_module_is_at_most_350_lines():
    long = {}
    for folder, _, names in os.walk(os.path.join(REPO, "alignment")):
        for name in names:
            if name.endswith(".py"):
                path = os.path.join(folder, name)
                with open(path, encoding="utf-8") as f:
                    lines = sum(1 for _ in f)
                if lines > LIMIT:
                    long[os.path.relpath(path, REPO)] = lines
    assert not long, f"over {LIMIT} lines: {long}"


def test_the_trainer_reads_as_a_recipe():
    with open(os.path.join(REPO, "alignment", "ppo", "ppo_trainer.py"), encoding="utf-8") as f:
        text = f.read()
    assert len(text.splitlines()) < 300
    assert "self.source" not in text and "if self.ppo.dynamic_sampling" not in text  # strategies, not branches
