"""The documentation site (docs/, mkdocs.yml): it builds with `mkdocs build --strict` (a broken link, a missing page
or a stale generated table fails), every generated part equals what the code's tables and the result files give, and
every shell block marked runnable runs: `# runnable` blocks here, `# runnable: slow` ones under -m slow. Each block
runs in its own temporary directory holding links to the checkout's folders, the tiny model and stand-ins for the
tiny SFT and reward models (docs/getting-started/testing.md)."""
import os
import shutil
import subprocess
import sys

import pytest

from docsgen import blocks, runnable
from tests.helpers import REPO

LINKED = ("alignment", "config", "data", "tools", "examples", "benchmarks")
BLOCKS = runnable.blocks()


def test_the_site_builds_strictly(tmp_path):
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    built = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-q", "-d", str(tmp_path / "site")],
                           cwd=REPO, capture_output=True, text=True, timeout=300, env=env)
    assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]
    assert (tmp_path / "site" / "paddlenlp" / "index.html").exists()
    api = (tmp_path / "site" / "reference" / "rl-math" / "index.html").read_text()
    assert "compute_gae" in api  # the API reference is made from the docstrings


def test_generated_parts_are_current():
    assert blocks.stale() == [], "run python -m docsgen"


def test_the_key_tables_list_every_paddlenlp_key_with_its_kind():
    from alignment.config import paddlenlp

    text = open(os.path.join(REPO, "docs", "paddlenlp.md"), encoding="utf-8").read()
    kinds = {"alias": "honoured as", "notice": "accepted (notice)", "refuse": "refused"}
    missing = [key for key, rule in paddlenlp.TABLE.items() if f"| `{key}` | {kinds[rule.kind]} |" not in text]
    assert not missing, missing


def test_a_stale_generated_part_is_found_and_rewritten():
    page = "before\n<!-- generated: paddlenlp-counts -->\nOf the 3 keys ...\n<!-- end generated -->\nafter\n"
    fresh = blocks.regenerate(page)
    assert fresh != page and fresh.startswith("before\n") and fresh.endswith("<!-- end generated -->\nafter\n")
    assert blocks.regenerate(fresh) == fresh


def test_runnable_blocks_are_found():
    assert len([b for b in BLOCKS if not b.slow]) >= 15 and any(b.slow for b in BLOCKS)
    pages = {b.page for b in BLOCKS}
    for recipe in ("ppo", "grpo", "dr-grpo", "rloo", "reinforce-plus-plus", "dapo", "gspo", "vapo"):
        assert f"recipes/{recipe}.md" in pages, recipe


@pytest.fixture(scope="session")
def workspace_base(tiny_model_dir, tiny_reward_dir, tmp_path_factory):
    base = tmp_path_factory.mktemp("docs-base")
    shutil.copytree(tiny_model_dir, base / "checkpoints" / "tiny")
    shutil.copytree(tiny_model_dir, base / "outputs" / "tiny-sft" / "model")
    shutil.copytree(tiny_reward_dir, base / "outputs" / "tiny-rm" / "model")
    return base


def run_block(block, base, tmp_path):
    work = tmp_path / "work"
    shutil.copytree(base, work)
    for name in LINKED:
        os.symlink(os.path.join(REPO, name), work / name)
    env = {**os.environ, "PYTHONPATH": str(work)}
    done = subprocess.run(["bash", "-euo", "pipefail", "-c", block.script], cwd=work, capture_output=True, text=True,
                          timeout=900, env=env)
    assert done.returncode == 0, f"{block.id}\n{block.script}\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}"


def test_blocks_run_by_another_test_are_run_there():
    by_tests = [b for b in BLOCKS if b.by]
    assert by_tests  # the smoke run of getting-started
    for block in by_tests:
        with open(os.path.join(REPO, block.by), encoding="utf-8") as f:
            test = f.read()
        assert "block_on(" in test and repr(block.page) in test, f"{block.id}: {block.by} does not run it"
        assert runnable.block_on(block.page, block.by) == block


@pytest.mark.parametrize("block", [b for b in BLOCKS if not b.slow and not b.by], ids=lambda b: b.id)
def test_runnable_block(block, workspace_base, tmp_path):
    run_block(block, workspace_base, tmp_path)


@pytest.mark.slow
@pytest.mark.parametrize("block", [b for b in BLOCKS if b.slow and not b.by], ids=lambda b: b.id)
def test_slow_runnable_block(block, workspace_base, tmp_path):
    run_block(block, workspace_base, tmp_path)
