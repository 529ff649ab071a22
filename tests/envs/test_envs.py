"""alignment/envs without a model: the environment registry, the checks of what a user environment returns, and
ToolEnvironment."""
import math
import textwrap

import pytest

from alignment.envs import (
    Environment,
    EnvironmentFailure,
    StepResult,
    ToolEnvironment,
    checked_reset,
    checked_step,
    load_environment_modules,
    make_environment,
)
from alignment.config.registry import Registered
from alignment.envs.formats import ToolCallFormat


class Echo(Environment):
    NAME = "test-echo"

    def reset(self, row):
        return [{"role": "user", "content": row["input"]}]

    def step(self, assistant_message):
        return StepResult([{"role": "user", "content": assistant_message.upper()}], 0.5, False)


# --------------------------------------------------------------------------- registry


def test_a_subclass_with_a_name_registers_and_a_helper_base_does_not():
    class Helper(Environment):  # no NAME: a base for others
        pass

    class Named(Helper):
        NAME = "test-named"

    assert Environment.lookup("test-named") is Named
    assert "test-echo" in Environment.registered_names()
    assert Helper not in Environment.REGISTRY.classes.values()
    assert isinstance(make_environment("test-echo"), Echo)


def test_unknown_environment_lists_the_known_names_on_one_line():
    with pytest.raises(ValueError) as err:
        make_environment("no-such-env")
    message = str(err.value)
    assert "unknown environment 'no-such-env'" in message and "test-echo" in message and "tools" in message
    assert "\n" not in message


def test_a_second_class_cannot_take_a_registered_name():
    with pytest.raises(ValueError, match="environment 'test-echo' is already registered by"):
        class Other(Environment):
            NAME = "test-echo"


def test_registries_are_separate_per_kind():
    assert "hermes" in ToolCallFormat.registered_names()
    assert "hermes" not in Environment.registered_names()
    assert "tools" not in ToolCallFormat.registered_names()
    assert "REGISTRY" not in Registered.__dict__


def test_user_env_modules_load_from_a_file_beside_the_argument_file(tmp_path):
    (tmp_path / "my_envs.py").write_text(textwrap.dedent("""
        from alignment.envs import Environment, StepResult

        class Guess(Environment):
            NAME = "test-guess-from-file"

            def reset(self, row):
                self.secret = row["answer"]
                return [{"role": "user", "content": "guess"}]

            def step(self, text):
                right = text.strip() == self.secret
                return StepResult([] if right else [{"role": "user", "content": "no"}], float(right), right)
    """))
    load_environment_modules(["my_envs.py"], base_dir=tmp_path)
    env = make_environment("test-guess-from-file")
    assert checked_reset(env, {"answer": "7"}) == [{"role": "user", "content": "guess"}]
    assert checked_step(env, " 7 ") == StepResult([], 1.0, True, {})
    with pytest.raises(FileNotFoundError, match="key 'user_env_modules': .*missing_envs.py"):
        load_environment_modules("missing_envs.py", base_dir=tmp_path)


# --------------------------------------------------------------------------- checks of what an environment returns


class Scripted(Environment):
    """Returns whatever the test puts in `reply` (or raises it)."""
    NAME = "test-scripted"

    def __init__(self, reply=None, first=None):
        self.reply, self.first = reply, first

    def reset(self, row):
        if isinstance(self.first, Exception):
            raise self.first
        return self.first

    def step(self, assistant_message):
        if isinstance(self.reply, Exception):
            raise self.reply
        return self.reply


USER = {"role": "user", "content": "hi"}


@pytest.mark.parametrize("reply, expected", [
    (KeyError("secret"), "step raised KeyError: 'secret'"),
    (ValueError("two\nlines"), "step raised ValueError: two lines"),
    ("more please", "step returned a str; it must return StepResult(observation, reward, done)"),
    (([USER], 1.0), "step returned a tuple; it must return StepResult"),
    (("hi", 1.0, False), "returned a str for the messages"),
    (([USER], "1", False), "returned reward '1'; it must be a finite number"),
    (([USER], math.nan, False), "returned reward nan"),
    (([USER], True, False), "returned reward True"),
    (([USER], 1.0, 1), "returned done=1; it must be True or False"),
    (([{"role": "bot", "content": "x"}], 0.0, False), "message 0 with role 'bot'; it must be one of system, user"),
    (([{"role": "user", "content": None}], 0.0, False), "message 0 with content of type NoneType"),
    (([USER, "x"], 0.0, False), "message 1 as a str"),
    (([], 0.0, False), "no observation messages for an episode that is not done"),
    (([USER], 0.0, False, {"tool_calls": "2"}), "metrics {'tool_calls': '2'}"),
])
def test_a_bad_step_is_a_one_line_error_naming_the_environment(reply, expected):
    with pytest.raises(EnvironmentFailure) as err:
        checked_step(Scripted(reply), "text")
    message = str(err.value)
    assert message.startswith("environment 'test-scripted': step") and expected in message
    assert "\n" not in message


@pytest.mark.parametrize("first, expected", [
    (ValueError("no prompt"), "reset raised ValueError: no prompt"),
    ([], "reset returned no messages"),
    ({"role": "user", "content": "hi"}, "reset returned a dict for the messages"),
])
def test_a_bad_reset_is_a_one_line_error_naming_the_environment(first, expected):
    with pytest.raises(EnvironmentFailure, match=f"environment 'test-scripted': {expected}"):
        checked_reset(Scripted(first=first), {})


def test_stop_strings_must_be_a_list_of_strings():
    from alignment.envs.base import checked_stop_strings

    env = Scripted()
    assert checked_stop_strings(env) == ()
    env.stop_strings = ["</answer>"]
    assert checked_stop_strings(env) == ("</answer>",)
    for bad in ("</answer>", [""], [3]):
        env.stop_strings = bad
        with pytest.raises(EnvironmentFailure, match="environment 'test-scripted': stop_strings must be a list of "
                                                     "non-empty strings"):
            checked_stop_strings(env)


def test_a_good_step_comes_back_normalised():
    result = checked_step(Scripted(([USER], 2, True)), "x")
    assert result == StepResult([USER], 2.0, True, {}) and type(result.reward) is float


# --------------------------------------------------------------------------- ToolEnvironment


def divide(a: int, b: int) -> float:
    """Divide."""
    return a / b



class AsyncGuess(Environment):
    NAME = "test-async-guess"

    async def reset(self, row):
        import asyncio

        await asyncio.sleep(0)
        self.secret = row["answer"]
        return [{"role": "user", "content": "guess"}]

    async def step(self, assistant_message):
        if assistant_message == "raise":
            raise ValueError("remote server down")
        done = assistant_message.strip() == self.secret
        return StepResult([] if done else [{"role": "user", "content": "no"}], float(done), done, {"guesses": 1})


def test_async_reset_and_step_are_awaited_and_checked_like_sync_ones():
    env = AsyncGuess()
    assert checked_reset(env, {"answer": "7"}) == [{"role": "user", "content": "guess"}]
    assert checked_step(env, "3") == StepResult([{"role": "user", "content": "no"}], 0.0, False, {"guesses": 1})
    assert checked_step(env, " 7 ") == StepResult([], 1.0, True, {"guesses": 1})
    with pytest.raises(EnvironmentFailure, match="^environment 'test-async-guess': step raised ValueError: remote "
                                                 "server down$"):
        checked_step(env, "raise")


def test_async_steps_called_from_several_threads_overlap_on_one_loop():
    import asyncio
    import time
    from concurrent.futures import ThreadPoolExecutor

    class Slow(Environment):
        async def reset(self, row):
            return [{"role": "user", "content": "go"}]

        async def step(self, text):
            await asyncio.sleep(0.3)
            return StepResult([], 1.0, True)

    envs = [Slow() for _ in range(8)]
    start = time.perf_counter()
    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(lambda env: checked_step(env, "x"), envs))
    elapsed = time.perf_counter() - start
    assert [r.reward for r in results] == [1.0] * 8
    assert elapsed < 8 * 0.3 / 2  # serially it would take 2.4 s


def test_tool_environment_runs_calls_then_ends_on_an_answer():
    answers = []
    env = ToolEnvironment(tools=["calculator", divide], reward_fn=lambda answer, row: answers.append(
        (answer, row["answer"])) or float(answer.strip() == row["answer"]))
    first = checked_reset(env, {"input": "What is 1234 * 5?", "answer": "6170"})
    assert [m["role"] for m in first] == ["system", "user"] and first[1]["content"] == "What is 1234 * 5?"
    assert '"name": "calculator"' in first[0]["content"] and '"name": "divide"' in first[0]["content"]
    assert env.stop_strings == ("</tool_call>",)

    calls = ('<tool_call>{"name": "calculator", "arguments": {"expression": "1234 * 5"}}</tool_call>'
             '<tool_call>{"name": "divide", "arguments": {"a": 1}}</tool_call>')
    result = checked_step(env, calls)
    assert result.observation == [{"role": "tool", "content": "6170"},
                                  {"role": "tool", "content": "Error: tool 'divide': bad arguments (missing a "
                                                              "required argument: 'b')"}]
    assert (result.reward, result.done) == (0.0, False)
    assert result.metrics["tool_calls"] == 2 and result.metrics["tool_errors"] == 1
    assert result.metrics["tool_time"] > 0  # measured (the two calls took some time), not left at 0

    bad = checked_step(env, "<tool_call>{not json}</tool_call>")
    assert bad.observation[0]["content"].startswith("Error: tool call is not valid JSON")
    assert not bad.done and bad.metrics["tool_errors"] == 1

    final = checked_step(env, " 6170")
    assert final == StepResult([], 1.0, True, {}) and answers == [(" 6170", "6170")]


def test_tool_environment_row_tools_and_limits():
    env = ToolEnvironment(tools=["calculator", divide], max_calls_per_turn=1, tool_role="user")
    system = checked_reset(env, {"input": ["hi", "hello", "add"], "tools": ["divide"]})
    assert '"name": "divide"' in system[0]["content"] and '"name": "calculator"' not in system[0]["content"]
    assert [m["role"] for m in system] == ["system", "user", "assistant", "user"]
    result = checked_step(env, '<tool_call>{"name": "calculator", "arguments": {"expression": "1"}}</tool_call>'
                               '<tool_call>{"name": "divide", "arguments": {"a": 1, "b": 4}}</tool_call>')
    assert [m["role"] for m in result.observation] == ["user", "user"]
    assert [m["content"] for m in result.observation] == [
        "Error: unknown tool 'calculator' (available: divide)",
        "Error: at most 1 tool calls per turn; this one was not run"]
    with pytest.raises(EnvironmentFailure, match=r"environment 'tools': reset raised ValueError: row asks for "
                                                 r"tools \['python'\] this environment was not given"):
        checked_reset(env, {"input": "x", "tools": ["python"]})
    with pytest.raises(EnvironmentFailure, match="environment 'tools': reset raised ValueError: row key 'input'"):
        checked_reset(env, {"input": 3})
    with pytest.raises(ValueError, match="environment 'tools': tools: 'nope' is neither a built-in tool"):
        ToolEnvironment(tools=["nope"])
    with pytest.raises(ValueError, match="environment 'tools': unknown tool-call format 'json'; registered: hermes"):
        ToolEnvironment(format="json")
