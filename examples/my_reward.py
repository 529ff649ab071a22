"""A reward function of your own, as a user writes it: `fn(prompts, completions, **labels) -> list[float]`, one
number per completion. `answer` is the prompt row's label (its `answer` column; None for a row without one).

Name it in `reward_funcs` by its file, `"reward_funcs": ["examples/my_reward.py:closeness"]` (docs/your-own/reward.md).
Importing the file also registers it as "closeness" (REWARD_FUNCTIONS), so an evaluation task in a module given
after it names it like a built-in (`reward_funcs = ("closeness",)`, examples/my_tasks.py).
"""
import re

from alignment import REWARD_FUNCTIONS

NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


@REWARD_FUNCTIONS.function("closeness")
def closeness(prompts, completions, answer=None, **labels):
    """1.0 for the right number, falling towards 0.0 with the distance from it (1 / (1 + distance)); 0.0 for a
    completion without a number or a row without a numeric answer. The last number in the completion counts."""
    answers = answer if answer is not None else [None] * len(completions)
    scores = []
    for completion, expected in zip(completions, answers):
        found = NUMBER.findall(completion)
        try:
            target = float(expected)
        except (TypeError, ValueError):
            target = None
        if not found or target is None:
            scores.append(0.0)
        else:
            scores.append(1.0 / (1.0 + abs(float(found[-1]) - target)))
    return scores
