"""The python sandbox wherever Python, the virtual environment and the project live. The containment tests run
here with this machine's interpreter (a pyenv under a home directory, /root when the tests run as root); this file
runs them again with a virtual environment and a copy of the project under /tmp, where the sandbox mounts its own
tmpfs: the interpreter's installation must stay importable and unwritable there."""
import os
import re
import shutil
import site
import subprocess
import sys
import tempfile

import pytest
from test_sandbox_containment import LACKS

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

pytestmark = pytest.mark.skipif(bool(LACKS), reason=f"this kernel cannot contain the sandbox: it lacks {LACKS}")


@pytest.fixture
def under_tmp():
    """A virtual environment (with this interpreter's packages, whether or not it runs in a virtual environment)
    and a copy of the project, both under /tmp."""
    base = tempfile.mkdtemp(prefix="alignment-under-tmp-", dir="/tmp")
    try:
        os.chmod(base, 0o755)  # as root the sandbox runs as nobody, and the ordinary-user test as another user
        venv, project = os.path.join(base, "venv"), os.path.join(base, "project")
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", venv], check=True)
        # this interpreter's packages by a .pth file: `--system-site-packages` from inside a virtual environment
        # would give the base installation's packages instead of this environment's
        purelib = subprocess.run([os.path.join(venv, "bin", "python"), "-c",
                                  "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                 capture_output=True, text=True, check=True).stdout.strip()
        with open(os.path.join(purelib, "outer-packages.pth"), "w", encoding="utf-8") as f:
            f.write("\n".join(site.getsitepackages()) + "\n")
        shutil.copytree(os.path.join(REPO, "alignment"), os.path.join(project, "alignment"),
                        ignore=shutil.ignore_patterns("__pycache__"))
        os.makedirs(os.path.join(project, "tests", "envs"))
        for name in ("pytest.ini", "tests/envs/test_sandbox_containment.py"):
            shutil.copy(os.path.join(REPO, name), os.path.join(project, name))
        yield os.path.join(venv, "bin", "python"), project
    finally:
        shutil.rmtree(base)


def test_the_containment_tests_pass_with_the_virtual_environment_and_the_project_under_tmp(under_tmp):
    python, project = under_tmp
    where = subprocess.run([python, "-c", "import sys, site, alignment.envs as envs\n"
                            "print(sys.prefix, site.getsitepackages()[0], envs.__file__)"],
                           cwd=project, capture_output=True, text=True, check=True).stdout.split()
    base = os.path.dirname(project)
    assert all(path.startswith(base + os.sep) for path in where), where  # it really runs from /tmp
    run = subprocess.run([python, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                          "tests/envs/test_sandbox_containment.py"],
                         cwd=project, capture_output=True, text=True, timeout=600)
    summary = run.stdout.strip().splitlines()[-1] if run.stdout.strip() else run.stderr
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
    # every test ran; only the ordinary-user one may skip (it needs root and util-linux to make that user)
    makes_a_user = os.geteuid() == 0 and all(shutil.which(tool) for tool in ("useradd", "unshare", "setpriv"))
    skips = "" if makes_a_user else "(, 1 skipped)?"
    assert re.fullmatch(rf"\d+ passed{skips} in [\d.]+s( \(\d+:\d+:\d+\))?", summary), summary
