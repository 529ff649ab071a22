"""The project installs as a package: a wheel built from pyproject.toml, installed into a fresh virtual environment
(the already-installed dependencies visible), imports from outside the checkout and exposes the console commands;
the README's install (`pip install -r requirements.txt`) gives every console command too.
Offline: pip may not reach an index (PIP_NO_INDEX), so the wheel is built with the installed setuptools (no build
isolation, which would download it; requirements.txt installs setuptools)."""
import os
import shutil
import subprocess
import sys
import tomllib

import pytest

from tests.helpers import REPO


def see_our_packages(python) -> None:
    """Make the dependencies installed for this test run visible in the new environment. Not --system-site-packages:
    when this interpreter is itself a venv, that shows the base interpreter's packages, not this venv's."""
    site_dir = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                              capture_output=True, text=True, check=True, timeout=60).stdout.strip()
    ours = [p for p in sys.path if p.rstrip("/").endswith(("site-packages", "dist-packages"))]
    with open(os.path.join(site_dir, "_outer_site_packages.pth"), "w") as f:
        f.write("\n".join(ours) + "\n")


def project_copy(tmp_path):
    """The files a build reads, copied: setuptools writes build/ and *.egg-info beside pyproject.toml."""
    source = tmp_path / "source"
    source.mkdir()
    for name in ("pyproject.toml", "README.md", "LICENSE", "requirements.txt"):
        shutil.copy(os.path.join(REPO, name), source / name)
    shutil.copytree(os.path.join(REPO, "alignment"), source / "alignment", ignore=shutil.ignore_patterns("__pycache__"))
    return source


def test_the_wheel_installs_and_its_commands_run_outside_the_checkout(tmp_path, tiny_model_dir):
    source = project_copy(tmp_path)
    offline = {**os.environ, "PIP_NO_INDEX": "1"}
    subprocess.run([sys.executable, "-m", "pip", "wheel", str(source), "--no-deps", "--no-build-isolation", "-q",
                    "-w", str(tmp_path / "dist")], check=True, capture_output=True, timeout=300, env=offline)
    wheel = next((tmp_path / "dist").glob("paddle_alignment-*.whl"))
    env_dir = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(env_dir)], check=True, timeout=120)
    python, bin_dir = env_dir / "bin" / "python", env_dir / "bin"
    see_our_packages(python)
    subprocess.run([str(python), "-m", "pip", "install", "-q", "--no-deps", str(wheel)], check=True,
                   capture_output=True, timeout=300, env=offline)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    imported = subprocess.run([str(python), "-c", "import alignment, os; from alignment.data import RawDataset; "
                               "print(os.path.dirname(alignment.__file__))"], cwd=elsewhere, env=env,
                              capture_output=True, text=True, timeout=120, check=True)
    assert str(env_dir) in imported.stdout  # the installed copy, not the checkout
    for command in ("alignment-sft", "alignment-rm", "alignment-ppo", "alignment-dpo"):
        shown = subprocess.run([str(bin_dir / command), "--help"], cwd=elsewhere, env=env, capture_output=True,
                               text=True, timeout=120)
        assert shown.returncode == 0 and "--output_dir" in shown.stdout, (command, shown.stderr[-500:])
    for command, flag in (("alignment-plot-run", "output_dir"), ("alignment-plan-layout", "--gpu-memory-gib"),
                          ("alignment-predict", "--max-new-tokens")):  # the tools' commands: package code, no tools/
        shown = subprocess.run([str(bin_dir / command), "--help"], cwd=elsewhere, env=env, capture_output=True,
                               text=True, timeout=120)
        assert shown.returncode == 0 and flag in shown.stdout, (command, shown.stderr[-500:])
    # a real (one-step) run through the console command, with an argument file and data outside the checkout
    (elsewhere / "train.jsonl").write_text('{"instruction": "Say hi", "output": "hi"}\n' * 4)
    (elsewhere / "args.yaml").write_text(f"model_name_or_path: {tiny_model_dir}\ntrain_datasets: alpaca:1.0:train.jsonl\n"
                                         "max_length: 32\nmax_steps: 1\nper_device_train_batch_size: 2\n"
                                         "output_dir: out\nreport_to: none\n")
    run = subprocess.run([str(bin_dir / "alignment-sft"), "args.yaml"], cwd=elsewhere, env=env, capture_output=True,
                         text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-1500:]
    assert "wall time:" in run.stdout and (elsewhere / "out" / "model" / "config.json").exists()
    module = subprocess.run([str(python), "-m", "alignment.dpo", "--help"], cwd=elsewhere, env=env,
                            capture_output=True, text=True, timeout=120)
    assert module.stdout.startswith("usage: python -m alignment.dpo"), module.stderr[-500:]


@pytest.mark.slow
def test_the_readme_install_gives_every_console_command(tmp_path):
    """`pip install -r requirements.txt` in the checkout, into a fresh virtual environment, offline (the
    dependencies already installed here are visible), provides every [project.scripts] command, and they run."""
    source = project_copy(tmp_path)
    env_dir = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(env_dir)], check=True, timeout=120)
    python, bin_dir = env_dir / "bin" / "python", env_dir / "bin"
    see_our_packages(python)
    offline = {**{k: v for k, v in os.environ.items() if k != "PYTHONPATH"}, "PIP_NO_INDEX": "1"}
    # the venv's own setuptools (Python 3.11 bundles 65) is too old for pyproject.toml: build with ours
    subprocess.run([str(python), "-m", "pip", "uninstall", "-y", "-q", "setuptools"], check=True,
                   capture_output=True, timeout=120, env=offline)
    installed = subprocess.run([str(python), "-m", "pip", "install", "-q", "--no-build-isolation", "-r",
                                "requirements.txt"], cwd=source, capture_output=True, text=True, timeout=600,
                               env=offline)
    assert installed.returncode == 0, installed.stderr[-2000:]
    commands = tomllib.load(open(os.path.join(REPO, "pyproject.toml"), "rb"))["project"]["scripts"]
    assert sorted(name for name in commands if not (bin_dir / name).exists()) == []
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    for command in ("alignment-serve", "alignment-check-env", "alignment-ppo"):
        shown = subprocess.run([str(bin_dir / command), "--help"], cwd=elsewhere, env=offline, capture_output=True,
                               text=True, timeout=120)
        assert shown.returncode == 0 and shown.stdout.startswith("usage: "), (command, shown.stderr[-500:])
