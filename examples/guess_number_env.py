"""A user environment written only against the public `alignment.envs` API: guess a number with higher/lower hints.

Load it with `user_env_modules: ["examples/guess_number_env.py"]` (or `load_environment_modules`) and pick it by
its NAME, "guess-number". A row needs an `answer` (the secret, 1-100); the reward is 1 for a right guess, minus
0.1 for each wrong one, and 0 for a turn without a number.
"""
import re

from alignment import Environment, StepResult

NUMBER = re.compile(r"-?\d+")


class GuessNumber(Environment):
    NAME = "guess-number"

    def reset(self, row):
        self.secret = int(row["answer"])
        return [{"role": "user", "content": "I am thinking of a number from 1 to 100. Guess it: answer with a "
                                            "number, and I will say higher or lower."}]

    def step(self, assistant_message):
        found = NUMBER.search(assistant_message)
        if found is None:
            return StepResult([{"role": "user", "content": "Please answer with a number."}], 0.0, False)
        guess = int(found.group())
        if guess == self.secret:
            return StepResult([], 1.0, True)
        hint = "Higher." if guess < self.secret else "Lower."
        return StepResult([{"role": "user", "content": hint}], -0.1, False)
