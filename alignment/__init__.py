"""PaddlePaddle-native RLHF toolkit: SFT, reward modelling and PPO-family policy optimisation.

Importing it changes no process settings; entry points call `alignment.cpu_env.apply_cpu_defaults()`.

The extension points are the public API, imported from here (`from alignment import RawDataset, Environment`):
each is loaded on first use, so `import alignment` stays cheap and loads no Paddle. A name's home module (below)
is where its docstring and built-ins live; the docs and examples import from `alignment`
(tests/repo/test_public_api.py).
"""
import importlib

__version__ = "0.1.0"

_HOMES = {
    # data and rewards
    "RawDataset": "alignment.data.raw",
    "import_function": "alignment.data.user_modules",
    "REWARD_FUNCTIONS": "alignment.config.registry",
    "JudgeParser": "alignment.rewards.judge_parsers",
    # environments, tools, agents' sandbox
    "Environment": "alignment.envs.base",
    "StepResult": "alignment.envs.base",
    "ToolCall": "alignment.envs.tools",
    "tool_schema": "alignment.envs.tools",
    "run_tool_call": "alignment.envs.tools",
    "ToolCallFormat": "alignment.envs.formats",
    "tool_call_format": "alignment.envs.formats",
    "BUILTIN_TOOLS": "alignment.envs.tool_env",
    "MCPServer": "alignment.envs.mcp_tools",
    "SandboxLimits": "alignment.envs.sandbox.runner",
    "run_python": "alignment.envs.sandbox.runner",
    "check_containment": "alignment.envs.sandbox.runner",
    # evaluation and tracking
    "EvalTask": "alignment.evaluation.tasks",
    "Tracker": "alignment.training.trackers.base",
    # the RL and preference math (these load Paddle)
    "AdvantageEstimator": "alignment.ppo.rl_math.estimators",
    "PolicyLoss": "alignment.ppo.rl_math.losses",
    "KLEstimator": "alignment.ppo.rl_math.kl",
    "DistillLoss": "alignment.ppo.rl_math.distill",
    "PreferenceLoss": "alignment.dpo.losses",
}
__all__ = sorted(_HOMES)


def __getattr__(name: str):
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'alignment' has no attribute {name!r}")
    value = getattr(importlib.import_module(home), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__():
    return sorted({*globals(), *_HOMES})
