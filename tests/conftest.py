import os
import sys

# thread settings must be in place before paddle is imported (see alignment/cpu_env.py)
for _key, _value in {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "2", "MKL_DEBUG_CPU_TYPE": "5"}.items():
    os.environ.setdefault(_key, _value)
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import pytest  # noqa: E402


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    """The tiny LLaMA + tokenizer of tools/make_tiny.py, built once per test session."""
    from tools import make_tiny

    return make_tiny.main(["--output", str(tmp_path_factory.mktemp("tiny") / "model")])


@pytest.fixture
def offline_datasets(monkeypatch, tmp_path):
    """No network (a test that connects fails) and a private `datasets` cache."""
    import socket

    from alignment.data import builtin

    def refuse(*args, **kwargs):
        raise AssertionError("network access attempted")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(builtin.datasets.config, "HF_DATASETS_CACHE", str(tmp_path / "hf-cache"))
