"""llms.txt (llmstxt.org: a title, a summary, link lists) and AGENTS.md stay true: every link and path they name
exists, llms.txt links every page of the site's nav, every command AGENTS.md shows runs a module or file that
exists, and both pass the docs' claims check (docsgen/claims.py: flags, keys, paths, figures, paragraphs)."""
import importlib.util
import os
import re

import pytest

from docsgen import claims
from tests.helpers import REPO

FILES = ("llms.txt", "AGENTS.md")
LINK = re.compile(r"\]\(([^)\s#]+)(?:#[^)]*)?\)")
FILE_LIKE = re.compile(r"^\.?[\w.-]*/?[\w./-]*\.(?:py|md|txt|toml|ini|yml|sh|json)$|^\.?[\w-]+/$|^\.ci/\w+$")


def read(name):
    with open(os.path.join(REPO, name), encoding="utf-8") as f:
        return f.read()


def nav_pages():
    """The Markdown pages of mkdocs.yml's nav (`- Title: page.md` or `- page.md` lines)."""
    return re.findall(r"^\s*- (?:[^:\n]+: )?([\w/.-]+\.md)\s*$", read("mkdocs.yml"), re.M)


@pytest.mark.parametrize("name", FILES)
def test_every_link_and_path_exists(name):
    text = read(name)
    links = LINK.findall(text)
    code = [span for span in re.findall(r"`([^`\n]+)`", text) if FILE_LIKE.match(span)]
    assert links or code
    missing = [path for path in links + code if not os.path.exists(os.path.join(REPO, path))]
    assert not missing, missing


def test_llms_txt_has_the_llmstxt_shape_and_links_every_page():
    text = read("llms.txt")
    lines = text.splitlines()
    assert lines[0].startswith("# ") and lines[2].startswith("> ")
    assert re.search(r"^## ", text, re.M) and re.search(r"^- \[[^\]]+\]\(docs/[\w/.-]+\.md\)", text, re.M)
    pages = nav_pages()
    assert len(pages) >= 40, "the nav was not read"
    linked = set(LINK.findall(text))
    assert [page for page in pages if f"docs/{page}" not in linked] == []


def test_the_commands_of_agents_md_exist():
    blocks = re.findall(r"```bash\n(.*?)```", read("AGENTS.md"), re.S)
    commands = [line.strip() for block in blocks for line in block.splitlines() if line.strip()]
    assert "python -m pytest -q" in commands
    for command in commands:
        module = re.search(r"python -m ([\w.]+)", command)
        if module:
            assert importlib.util.find_spec(module.group(1)) is not None, command
        for word in command.split():
            assert not FILE_LIKE.match(word) or os.path.exists(os.path.join(REPO, word)), command


def test_both_pass_the_docs_claims_check():
    found = claims.check({name: read(name) for name in FILES})
    assert not found, "\n".join(map(str, found))
