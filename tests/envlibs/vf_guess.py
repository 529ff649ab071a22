"""A verifiers (legacy API) environment module for the adapter tests: `load_environment(kind=...)` builds a
multi-turn guessing game ("game") or a tool environment with an `add` tool ("tools"), each scored by its rubric;
"grouped": the game scored by a RubricGroup one of whose rubrics has a group-level reward function; "breaks": the
game, whose environment response raises for a row whose answer is 3."""
import re

import verifiers as vf
from datasets import Dataset


class GuessEnv(vf.MultiTurnEnv):
    """Guess the row's answer (a number); the environment says higher or lower; three guesses."""

    async def setup_state(self, state):
        state["guesses"] = 0
        return state

    def __init__(self, breaks=False, **kwargs):
        super().__init__(**kwargs)
        self.breaks = breaks

    async def env_response(self, messages, state, **kwargs):
        state["guesses"] += 1
        if self.breaks and int(state["answer"]) == 3:
            raise RuntimeError("the game broke")
        guess = _number(messages[-1].content or "")
        if guess is not None and guess == int(state["answer"]):
            state["final_env_response"] = [vf.UserMessage(content="Right.")]
            return state["final_env_response"]
        hint = "Give a number." if guess is None else ("Higher." if guess < int(state["answer"]) else "Lower.")
        return [vf.UserMessage(content=hint)]


def _number(text):
    found = re.search(r"-?\d+", text)
    return None if found is None else int(found.group())


async def guessed(completion, answer, **kwargs):
    """1 when some assistant turn named the answer."""
    return float(any(_number(m.content or "") == int(answer) for m in completion if m.role == "assistant"))


async def short(completion, **kwargs):
    """Fewer turns score more."""
    return 1.0 / max(1, sum(m.role == "assistant" for m in completion))


def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: The first addend.
        b: The second addend.
    """
    return a + b


async def used_the_answer(completion, answer, **kwargs):
    """1 when the final assistant message contains the answer."""
    said = [m.content or "" for m in completion if m.role == "assistant"]
    return float(bool(said) and str(answer) in said[-1])


async def shorter_than_the_group(completions, **kwargs):
    """A group-level reward function (verifiers knows one by its plural arguments): 1 for the shortest completion."""
    lengths = [len(completion) for completion in completions]
    return [float(length == min(lengths)) for length in lengths]


def load_environment(kind: str = "game", max_turns: int = 3) -> vf.Environment:
    if kind == "tools":
        data = Dataset.from_list([{"question": f"What is {a} + {b}?", "answer": str(a + b)} for a, b in
                                  ((2, 3), (40, 2))])
        return vf.ToolEnv(tools=[add], max_turns=max_turns, system_prompt="Use the tools.", dataset=data,
                          rubric=vf.Rubric(funcs=[used_the_answer]))
    data = Dataset.from_list([{"question": "Guess my number (1-9).", "answer": str(n)} for n in (3, 7)])
    rubric = vf.Rubric(funcs=[guessed, short], weights=[1.0, 0.5])
    if kind == "grouped":
        rubric = vf.RubricGroup([rubric, vf.Rubric(funcs=[shorter_than_the_group])])
    return GuessEnv(breaks=kind == "breaks", max_turns=max_turns, system_prompt="Guess the number.", dataset=data,
                    rubric=rubric)
