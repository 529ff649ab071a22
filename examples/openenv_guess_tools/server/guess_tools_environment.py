"""Guess a number from 1 to 9 (drawn from the reset seed) by calling the MCP tool `guess`; three guesses. Each
call's reward is 1 for the right number and -0.1 otherwise; the right number or the third guess ends the episode."""
import random
from typing import Optional

from fastmcp import FastMCP
from openenv.core import CallToolAction, MCPEnvironment, Observation, State


class GuessObservation(Observation):
    text: str = ""


class GuessToolsEnvironment(MCPEnvironment):
    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self, max_guesses: int = 3):
        server = FastMCP("guess")

        @server.tool()
        def guess(number: int) -> str:
            """Guess the secret number.

            Args:
                number: A whole number from 1 to 9.
            """
            self.guesses += 1
            self.solved = number == self.secret
            return "Right." if self.solved else ("Higher." if number < self.secret else "Lower.")

        super().__init__(server)
        self.max_guesses, self.secret, self.guesses, self.solved = max_guesses, 0, 0, False
        self._state = State()

    def reset(self, seed: Optional[int] = None, episode_id: Optional[str] = None, **kwargs) -> GuessObservation:
        self.secret, self.guesses, self.solved = random.Random(seed).randint(1, 9), 0, False
        self._state = State(episode_id=episode_id, step_count=0)
        return GuessObservation(text="Find my number from 1 to 9 with the guess tool.")

    async def step_async(self, action, timeout_s: Optional[float] = None, **kwargs):
        observation = await super().step_async(action, timeout_s=timeout_s, **kwargs)
        if isinstance(action, CallToolAction):
            observation.reward = 1.0 if self.solved else -0.1
            observation.done = self.solved or self.guesses >= self.max_guesses
        return observation

    def _step_impl(self, action, timeout_s: Optional[float] = None, **kwargs) -> GuessObservation:
        return GuessObservation(text="Use the guess tool.")

    @property
    def state(self) -> State:
        return self._state
