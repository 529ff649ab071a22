"""An evaluation task of your own: held-out rows and the registered reward functions that score them
(alignment/evaluation/tasks.py). Run it after the module that registers its reward function:

    alignment-eval --model DIR --task-module examples/my_reward.py --task-module examples/my_tasks.py --task my_sums
"""
from alignment import EvalTask


class MySums(EvalTask):
    NAME = "my_sums"
    reward_funcs = ("closeness",)   # examples/my_reward.py registers it
    success_threshold = 1.0         # a sample is correct when its reward reaches this: the exact number
    max_new_tokens = 8

    def rows(self):
        return [{"input": f"What is {a} + {b}? Answer with the number.", "answer": str(a + b)}
                for a in range(3) for b in range(3)]
