"""TRL's environment classes against TRL itself (slow: TRL needs torch, so it is not in requirements.txt; these run
in a virtualenv that has TRL, e.g. the one docs/agentic/adapters.md makes, named by ALIGNMENT_TRL_PYTHON or found
at /tmp/venv-trl). The tools the adapter shows are the ones TRL's GRPOTrainer shows for the same class (transformers'
get_json_schema, which TRL's chat template rendering uses), and the adapter's tests and GRPO step pass with TRL,
torch and paddle installed together."""
import os
import subprocess

import pytest

from tests.helpers import REPO

PYTHON = os.environ.get("ALIGNMENT_TRL_PYTHON", "/tmp/venv-trl/bin/python")

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not os.path.exists(PYTHON), reason=f"no virtualenv with TRL at {PYTHON}")]

SCHEMAS = """
import inspect, json, sys
sys.path.insert(0, {repo!r})
import trl
from transformers.utils import get_json_schema
from alignment.envs import environment_factory
from tests.envlibs.trl_calc import AdditionEnv

instance = AdditionEnv()
trl_tools = [getattr(instance, name) for name, _ in inspect.getmembers(AdditionEnv, predicate=inspect.isfunction)
             if name not in ("reset", "get_reward") and not name.startswith("_")]  # GRPOTrainer's rule
theirs = {{tool.__name__: get_json_schema(tool) for tool in trl_tools}}
for schema in theirs.values():
    schema["function"].pop("return", None)
ours = {{name: tool.schema for name, tool in environment_factory("trl", {{"cls": "tests.envlibs.trl_calc:AdditionEnv"}})()
        .tools.items()}}
print(json.dumps({{"trl": trl.__version__, "same": ours == theirs, "ours": ours, "theirs": theirs}}))
"""


def test_the_adapter_shows_the_tools_trl_shows():
    done = subprocess.run([PYTHON, "-c", SCHEMAS.format(repo=REPO)], cwd=REPO, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    result = __import__("json").loads(done.stdout.strip().splitlines()[-1])
    assert result["same"], (result["ours"], result["theirs"])


def test_the_trl_adapter_trains_with_trl_torch_and_paddle_installed_together():
    done = subprocess.run([PYTHON, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/envs/test_env_adapters.py",
                           "-k", "trl"], cwd=REPO, capture_output=True, text=True, timeout=1200)
    assert done.returncode == 0, done.stdout[-3000:]
    assert "2 passed" in done.stdout
