"""No module of ours shadows an installed top-level package, however a program is started. `python folder/script.py`
puts the script's folder first on sys.path (and `python -m` from the checkout puts the checkout), so a module file
there named like an installed distribution's top-level package (alignment/ppo/agents.py against openai-agents'
`agents`, which verifiers' ToolEnv imports) or a standard-library module replaces it for everything the program
imports."""
import importlib.metadata
import os
import subprocess
import sys

from tests.helpers import REPO

SKIPPED = {"__pycache__", "node_modules", "site", "outputs", "build", "site-packages", "dist-packages"}


def _top_level_names() -> set:
    """Installed top-level names, not counting our own distribution's (`alignment`, once the project is installed)."""
    others = {name for name, dists in importlib.metadata.packages_distributions().items()
              if set(dists) - {"paddle-alignment"}}
    return others | set(sys.stdlib_module_names)


def _is_script(path: str) -> bool:
    name = os.path.basename(path)
    if name == "__main__.py" or name.startswith("run_"):
        return True
    with open(path, encoding="utf-8", errors="replace") as f:
        text = f.read()
    return "__name__ == \"__main__\"" in text or "__name__ == '__main__'" in text


def entry_folders() -> list:
    """Every folder a program can be started from: the checkout (`python -m ...` from it), each folder holding a
    `run_*.py`, a `__main__.py` or any script with a main guard (tools/, benchmarks/, examples/, tests/scripts/)."""
    folders = {REPO}
    for root, dirs, names in os.walk(REPO):
        dirs[:] = [d for d in dirs if d not in SKIPPED and not d.startswith(".")  # .git, .venv-ci
                   and not os.path.exists(os.path.join(root, d, "pyvenv.cfg"))]  # a virtual environment
        if any(name.endswith(".py") and _is_script(os.path.join(root, name)) for name in names):
            folders.add(root)
    return sorted(folders)


def importable_names(folder: str) -> dict:
    """What `import NAME` would find in the folder: module files and regular packages (namespace folders lose to
    any installed package, so they cannot shadow one)."""
    found = {}
    for name in os.listdir(folder):
        path = os.path.join(folder, name)
        if name.endswith(".py"):
            found[name[:-3]] = path
        elif os.path.isfile(os.path.join(path, "__init__.py")):
            found[name] = path
    return found


def test_the_entry_folders_include_every_way_a_program_starts():
    folders = {os.path.relpath(f, REPO) for f in entry_folders()}
    assert {".", "tools", "benchmarks", "docsgen", "alignment/ppo", "alignment/sft", "alignment/rm",
            "alignment/dpo"} <= folders


def test_no_module_in_an_entry_folder_is_named_like_an_installed_package():
    taken = _top_level_names()
    assert "json" in taken and "yaml" in taken and "alignment" not in taken
    assert "verifiers" not in taken or "agents" in taken  # verifiers (extra `envs`) brings openai-agents
    clashes = [os.path.relpath(path, REPO) for folder in entry_folders()
               for name, path in importable_names(folder).items() if name in taken]
    assert clashes == [], f"rename these (they hide an installed package or stdlib module): {clashes}"


def test_a_stage_started_as_a_script_imports_the_installed_agents_package():
    """The reported case: `python alignment/ppo/run_ppo.py` with a verifiers ToolEnv imports `agents`."""
    folder = os.path.join(REPO, "alignment", "ppo")  # what running a script of that folder puts first
    script = "import sys; sys.path.insert(0, sys.argv[1]); import agents; print(agents.__file__)"
    shown = subprocess.run([sys.executable, "-c", script, folder], cwd=REPO, capture_output=True, text=True,
                           timeout=120)
    assert shown.returncode == 0, shown.stderr[-500:]
    found = os.path.realpath(shown.stdout.strip())
    assert not found.startswith(os.path.realpath(os.path.join(REPO, "alignment")) + os.sep), found
    assert "site-packages" in found.split(os.sep), found  # the installed distribution (CI's venv sits in REPO)
