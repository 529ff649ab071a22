"""An OpenEnv environment (server side, written against openenv.core) for the adapter tests: guess a number
from 1 to 9 drawn from the reset seed; the reward is 1 for the right guess, -0.1 for a wrong one."""
import random
import re
from typing import Optional

from openenv.core import Action, Environment, Observation, State


class GuessAction(Action):
    guess: str


class GuessObservation(Observation):
    text: str = ""


class GuessEnvironment(Environment[GuessAction, GuessObservation, State]):
    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self, max_guesses: int = 3):
        super().__init__()
        self.max_guesses = max_guesses
        self._state = State()

    def reset(self, seed: Optional[int] = None, episode_id: Optional[str] = None, **kwargs) -> GuessObservation:
        self.secret = random.Random(seed).randint(1, 9)
        self._state = State(episode_id=episode_id, step_count=0)
        return GuessObservation(text="Guess my number from 1 to 9.")

    def step(self, action: GuessAction, timeout_s: Optional[float] = None, **kwargs) -> GuessObservation:
        self._state.step_count += 1
        found = re.search(r"\d+", action.guess)
        if found and int(found.group()) == self.secret:
            return GuessObservation(text="Right.", reward=1.0, done=True)
        hint = "A number, please." if not found else ("Higher." if int(found.group()) < self.secret else "Lower.")
        return GuessObservation(text=hint, reward=-0.1, done=self._state.step_count >= self.max_guesses)

    @property
    def state(self) -> State:
        return self._state
