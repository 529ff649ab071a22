"""Console commands (pyproject.toml [project.scripts]) and `python -m alignment.<stage>`.

Each command runs a stage's or a tool's `main()` through alignment/exits.py's `run_program` and exits 0 when it
returns: the `main()` functions return their results (metrics, paths) to tests and programs that call them, and
`sys.exit` would take such a value for an error. The tools' programs live in alignment/commands/ (the checkout's tools/*.py scripts run the same `main()`).
"""
from __future__ import annotations

import importlib

from alignment.exits import run_program

# never import paddle
NO_PADDLE = ("show_generations", "plot_run", "plot_overoptimization", "plan_layout", "replay_ledger", "check_env")


def _run(module: str) -> int:
    """The exit code of the module's main() run as a program (alignment/exits.py: one line on error, no
    traceback, 2 for bad input, 1 for failures, 130 / 143 for SIGINT / SIGTERM)."""
    return run_program(importlib.import_module(module).main, uses_paddle=module.rsplit(".", 1)[-1] not in NO_PADDLE)


def sft() -> int:
    return _run("alignment.sft.run_sft")


def rm() -> int:
    return _run("alignment.rm.run_reward")


def ppo() -> int:
    return _run("alignment.ppo.run_ppo")


def distill() -> int:
    return _run("alignment.ppo.run_distill")


def dpo() -> int:
    return _run("alignment.dpo.run_dpo")


def kto() -> int:
    return _run("alignment.dpo.run_kto")


TOOLS = ("predict", "export_model", "import_gguf", "convert_checkpoint", "merge_lora", "generate", "judge_policy",
         "show_generations", "plot_run", "plot_overoptimization", "plan_layout", "reward_server", "make_tiny",
         "replay_ledger", "check_env", "serve", "evaluate", "tinker_serve")


def predict() -> int:
    return _run("alignment.commands.predict")


def export_model() -> int:
    return _run("alignment.commands.export_model")


def import_gguf() -> int:
    return _run("alignment.commands.import_gguf")


def convert_checkpoint() -> int:
    return _run("alignment.commands.convert_checkpoint")


def merge_lora() -> int:
    return _run("alignment.commands.merge_lora")


def generate() -> int:
    return _run("alignment.commands.generate")


def evaluate() -> int:
    return _run("alignment.commands.evaluate")


def judge_policy() -> int:
    return _run("alignment.commands.judge_policy")


def show_generations() -> int:
    return _run("alignment.commands.show_generations")


def replay_ledger() -> int:
    return _run("alignment.commands.replay_ledger")


def plot_run() -> int:
    return _run("alignment.commands.plot_run")


def plot_overoptimization() -> int:
    return _run("alignment.commands.plot_overoptimization")


def plan_layout() -> int:
    return _run("alignment.commands.plan_layout")


def reward_server() -> int:
    return _run("alignment.commands.reward_server")


def make_tiny() -> int:
    return _run("alignment.commands.make_tiny")


def check_env() -> int:
    return _run("alignment.commands.check_env")


def serve() -> int:
    return _run("alignment.commands.serve")


def tinker_serve() -> int:
    return _run("alignment.commands.tinker_serve")
