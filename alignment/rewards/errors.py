"""The error of a reward source that cannot give a valid reward (functions.py, remote.py, model_judges.py)."""


class RewardFunctionError(ValueError):
    """A reward function raised, or returned something other than one finite float per completion."""
