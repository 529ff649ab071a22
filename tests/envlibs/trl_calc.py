"""A TRL-style environment class (written to GRPOTrainer's documented `environment_factory` interface: built
without arguments, `reset(**row) -> str | None`, public methods are tools, `get_reward() -> float`): the policy
must compute the row's sum with the `add` tool and `submit` the result."""


class AdditionEnv:
    def __init__(self):
        self.answer, self.submitted, self.calls = None, None, 0

    def reset(self, **kwargs) -> str | None:
        self.answer, self.submitted, self.calls = int(kwargs["answer"]), None, 0
        return " (use the tools)"

    def add(self, a: int, b: int) -> int:
        """Add two integers.

        Args:
            a: The first addend.
            b: The second addend.
        """
        self.calls += 1
        return a + b

    async def submit(self, value: int) -> str:
        """Submit the final result.

        Args:
            value: The sum you computed.
        """
        self.submitted = value
        return "submitted"

    def get_reward(self) -> float:
        return 1.0 if self.submitted == self.answer else 0.0

    def _private(self) -> None:
        """Not a tool: starts with an underscore."""
