"""The evaluation harness: tasks (a registry), the policies they sample (a checkpoint through the decode engine,
or an OpenAI-compatible endpoint), pass@k / maj@k / mean@k with bootstrap intervals, resumable result files.
`alignment-eval` is its command line; training's `eval_tasks` runs the same `evaluate`."""
from alignment.evaluation.tasks import EvalTask, make_task  # noqa: F401

__all__ = ["EvalTask", "make_task"]
