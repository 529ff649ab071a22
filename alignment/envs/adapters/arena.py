"""TextArena games ("textarena"): the policy plays one seat, a fixed opponent the others.

    "environment": "textarena",
    "environment_args": {"id": "TicTacToe-v0", "seat": 0, "opponent": "random-move"}

Each turn the policy reads the game's new messages for its seat ("[GAME] ..." lines; the observation wrappers'
whole-game text would repeat what the conversation already holds) and its answer is the seat's action. The
opponent seats are played between the policy's turns by `opponent`:
- "random-move" (default): a move drawn from the bracketed moves the game last listed to that seat (e.g.
  "Available Moves: '[0]', '[4]'"), seeded by the episode's seed, so an episode replays exactly;
- 'module:function' / 'file.py:function': called with the seat's whole observation text, returning its action
  (a TextArena `Agent` class is instantiated without arguments: a frozen model or an API model).
The trained policy as its own opponent is left out: its other seat would be a second episode sampled in step
with this one, and one conversation playing both seats would show each seat the other's hidden cards and earn a
zero-sum reward (no GRPO signal). The reward is the seat's game reward at the end (TextArena: +1 win, -1 loss,
0 draw); the seat's `invalid_move` and `turn_count` are the last step's metrics. `num_players: 1` plays a
single-player game.
"""
from __future__ import annotations

import random
import re
from typing import Any, Callable, List, Mapping, Tuple

from alignment.data import import_function
from alignment.envs.adapters.common import PrivateRandom, numbers, require, row_seed
from alignment.envs.base import Environment, Message, StepResult

_LISTED_MOVE = re.compile(r"'(\[[^\]\n]{1,40}\])'")
_ANY_MOVE = re.compile(r"\[[^\[\]\n]{1,40}\]")


class RandomMove:
    """The built-in opponent: a random move among those the game's latest listing shows."""

    def __init__(self, seed: int):
        self.rng = random.Random(seed)

    def __call__(self, observation: str) -> str:
        for pattern in (_LISTED_MOVE, _ANY_MOVE):
            for line in reversed(observation.splitlines()):
                moves = [m for m in pattern.findall(line) if not m.startswith(("[GAME]", "[Player"))]
                if moves:
                    return self.rng.choice(moves)
        return "[pass]"


class TextArenaEnvironment(Environment):
    NAME = "textarena"

    def __init__(self, id: str = "", seat: int = 0, num_players: int = 2, opponent: str = "random-move",
                 **kwargs: Any):
        self.ta = require("textarena", "textarena", self.NAME)
        if id not in self.ta.envs.registration.ENV_REGISTRY:
            raise ValueError(f"environment 'textarena': no game {id!r} is registered (e.g. 'TicTacToe-v0')")
        if not 0 <= seat < num_players:
            raise ValueError(f"environment 'textarena': seat {seat} is not one of the {num_players} players")
        self.id, self.seat, self.num_players, self.kwargs = id, seat, num_players, kwargs
        self.opponent_spec = opponent
        self.fixed_opponent = None if opponent == "random-move" else self._load_opponent(opponent)
        self.env: Any = None

    def _load_opponent(self, spec: str) -> Callable[[str], str]:
        if ":" not in spec:
            raise ValueError(f"environment 'textarena': opponent {spec!r} is neither 'random-move' nor "
                             f"'module:function' / 'file.py:function'")
        opponent = import_function(spec, "environment 'textarena' 'opponent'")
        return opponent() if isinstance(opponent, type) else opponent

    @property
    def env_name(self) -> str:
        return f"{self.NAME}[{self.id}]"

    def reset(self, row: Mapping[str, Any]) -> List[Message]:
        seed = row_seed(row)
        self.random = PrivateRandom(seed)
        self.opponent = self.fixed_opponent or RandomMove(seed)
        self.seen = {pid: "" for pid in range(self.num_players)}  # each opponent seat's text so far
        with self.random():
            self.env = self.ta.make(self.id, **self.kwargs)
            self.env.reset(num_players=self.num_players, seed=seed)
        self.game = self.env
        while isinstance(self.game, self.ta.Wrapper):  # the game itself: its new messages, not the wrappers' text
            self.game = self.game.env
        text, done = self._play_opponents()
        if done:
            raise ValueError(f"game {self.id!r} ended before seat {self.seat} had a turn")
        return [{"role": "user", "content": text}]

    def step(self, assistant_message: str) -> StepResult:
        with self.random():
            done, _info = self.env.step(assistant_message)
        text = ""
        if not done:
            text, done = self._play_opponents()
        if not done:
            return StepResult([{"role": "user", "content": text}], 0.0, False)
        rewards, game_info = self.env.close()
        reward = float((rewards or {}).get(self.seat, 0.0))
        seat_info = (game_info or {}).get(self.seat, {})
        final = self._messages(self.game.state.observations.get(self.seat, []))
        return StepResult([{"role": "user", "content": final}] if final else [], reward, True, numbers(seat_info))

    def _play_opponents(self) -> Tuple[str, bool]:
        """Opponent seats move until the policy's seat is to act; its new messages as text, and whether the game
        ended on the way."""
        while True:
            with self.random():
                player, messages = self.game.get_observation()
            if player == self.seat:
                return self._messages(messages), False
            self.seen[player] += "\n" + self._messages(messages)
            with self.random():
                done, _info = self.env.step(self.opponent(self.seen[player]))
            if done:
                return "", True

    def _messages(self, messages) -> str:
        names = self.game.state.role_mapping
        return "\n".join(f"[{'GAME' if sender == self.ta.GAME_ID else names.get(sender, f'Player {sender}')}] "
                         f"{text}" for sender, text, *_ in messages).strip()
