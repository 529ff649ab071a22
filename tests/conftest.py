import os
import sys

os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from alignment.cpu_env import apply_cpu_defaults, cores_per_process, usable_cores  # noqa: E402

if int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")) > 1:
    # a suite's xdist workers share the cores as a launch's processes do: MKL, our kernels and the optimizer on
    # the cores over the workers (as a user running two jobs on one machine would set), not a team each per core
    for _key in ("MKL_NUM_THREADS", "ALIGNMENT_OPTIMIZER_THREADS"):
        os.environ.setdefault(_key, str(cores_per_process(int(os.environ["PYTEST_XDIST_WORKER_COUNT"]))))
apply_cpu_defaults()  # this CPU's thread and MKL settings, before paddle is imported

# paddle.distributed.launch takes its master's port from PORT_RANGE (default 35100:64000, from a random start),
# which overlaps Linux's ephemeral ports (32768-60999): in the seconds between the launcher's choice and rank 0's
# bind (Paddle's import), a gloo connection of a concurrent test can take that port, and rank 0 aborts in
# TCPStore's libuv server (seen once in CI). Each xdist worker's launches take ports below the ephemeral range,
# in a slice of their own.
_worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
_slice = int(_worker[2:]) % 10 if _worker[2:].isdigit() else 0
os.environ.setdefault("PORT_RANGE", f"{10000 + 2000 * _slice}:{11999 + 2000 * _slice}")

import pytest  # noqa: E402


def pytest_xdist_auto_num_workers(config):
    """pytest.ini's `-n auto`. The default suite: two worker processes (pytest-xdist; its tests are mostly
    one-threaded process starts and tiny runs). The parallel suite: 1.5 workers a core (3 on 2 cores), at most one
    per 4 GiB of free memory (a launch of 8 ranks: ~3.6 GiB, estimated from a rank's ~450 MB measured on the tiny
    model): its launches wait much of their time (the launcher polls its ranks each second, ranks meet at stores, one
    rank writes while the others have ended), so one test at a time kept 2 cores 58% busy (31m43s) and three workers
    kept them 96% busy (19m13s, the same CPU seconds), measured on a 2-core AMD EPYC Zen 3. The slow suite: one test
    at a time, since its tests load the CPU on purpose (the same bits on an idle and on a loaded machine) and hold a
    real model each."""
    markexpr = config.option.markexpr
    cores = usable_cores()
    if markexpr == "not slow and not parallel":
        return 2 if cores >= 2 else 0
    if markexpr == "parallel":
        memory_gib = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") / 2 ** 30
        workers = min(cores + cores // 2, int(memory_gib // 4))
        return workers if workers >= 2 else 0
    return 0

import alignment.dpo.losses  # noqa: E402,F401  the preference losses DPO arguments name
import alignment.ppo.rl_math.registrations  # noqa: E402,F401  the estimators, losses, KL estimators PPO arguments name


@pytest.fixture
def paddles_operations(monkeypatch):
    """Paddle's operations instead of our CPU kernels (ALIGNMENT_CPU_KERNELS=off) for a test that compares the bits
    of two paths where only one would take a kernel: the fused decoder's decode kernels round differently from the
    model's layers (tests/cpu_kernels check that path)."""
    from alignment import cpu_kernels

    monkeypatch.setenv("ALIGNMENT_CPU_KERNELS", "off")
    cpu_kernels.forget_choice()
    yield
    cpu_kernels.forget_choice()


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    """The tiny LLaMA + tokenizer of tools/make_tiny.py, built once per test session."""
    from alignment.commands import make_tiny

    return make_tiny.main(["--output", str(tmp_path_factory.mktemp("tiny") / "model")])


@pytest.fixture(scope="session")
def tiny_reward_dir(tiny_model_dir, tmp_path_factory):
    """A score model on the tiny backbone with a seeded random head (a stand-in reward model / critic)."""
    import paddle

    from alignment.models.score_model import ScoreModel

    paddle.seed(11)
    model = ScoreModel.from_pretrained(tiny_model_dir)
    path = str(tmp_path_factory.mktemp("rm") / "model")
    model.save_pretrained(path, tokenizer_dir=tiny_model_dir)
    return path


@pytest.fixture(scope="session")
def tiny_teacher_dir(tiny_model_dir, tmp_path_factory):
    """A distillation teacher: the tiny model with its weights perturbed (seeded), so the same tokenizer and other
    next-token distributions."""
    import paddle

    from alignment.models import LlamaForCausalLM

    paddle.seed(5)
    model = LlamaForCausalLM.from_pretrained(tiny_model_dir)
    for param in model.parameters():
        param.set_value(param + paddle.randn(param.shape).astype(param.dtype) * 0.05)
    path = str(tmp_path_factory.mktemp("teacher") / "model")
    model.save_pretrained(path, tokenizer_dir=tiny_model_dir)
    return path


@pytest.fixture
def offline_datasets(monkeypatch, tmp_path):
    """No network (a test that connects fails) and a private `datasets` cache."""
    import socket

    import datasets

    def refuse(*args, **kwargs):
        raise AssertionError("network access attempted")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", str(tmp_path / "hf-cache"))
