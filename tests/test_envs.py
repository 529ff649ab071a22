"""alignment/envs without a model: the environment registry and its checks, tool schemas, the Hermes tool-call
format, running tool calls (every failure an observation), the calculator and ToolEnvironment."""
import json
import math
import textwrap
import time
from typing import List, Literal, Optional

import pytest

from alignment.envs import (
    BUILTIN_TOOLS,
    Environment,
    EnvironmentFailure,
    StepResult,
    ToolCall,
    ToolEnvironment,
    as_tool,
    calculator,
    checked_reset,
    checked_step,
    load_environment_modules,
    make_environment,
    run_tool_call,
    tool_call_format,
    tool_schema,
)
from alignment.envs.base import Registered
from alignment.envs.calculator import CalculatorError
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
    assert Helper not in Environment._registry.values()
    assert isinstance(make_environment("test-echo"), Echo)


def test_unknown_environment_lists_the_known_names_on_one_line():
    with pytest.raises(ValueError) as err:
        make_environment("no-such-env")
    message = str(err.value)
    assert "unknown environment 'no-such-env'" in message and "test-echo" in message and "tools" in message
    assert "\n" not in message


def test_a_second_class_cannot_take_a_registered_name():
    with pytest.raises(ValueError, match="environment name 'test-echo' is already registered by"):
        class Other(Environment):
            NAME = "test-echo"


def test_registries_are_separate_per_kind():
    assert "hermes" in ToolCallFormat.registered_names()
    assert "hermes" not in Environment.registered_names()
    assert "tools" not in ToolCallFormat.registered_names()
    assert Registered.__dict__.get("_registry") is None


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


# --------------------------------------------------------------------------- tool schemas


def lookup(city: str, days: int = 1, units: Literal["c", "f"] = "c", tags: Optional[List[str]] = None,
           exact: bool = False, scale: float = 1.0) -> str:
    """Look up the weather.

    Args:
        city: The city name,
            continued on a second line.
        days (int): How many days.
        units: Celsius or Fahrenheit.

    Returns:
        A forecast.
    """
    return f"{city}:{days}"


def test_tool_schema_from_type_hints_and_docstring():
    assert tool_schema(lookup) == {"type": "function", "function": {
        "name": "lookup", "description": "Look up the weather.",
        "parameters": {"type": "object", "required": ["city"], "properties": {
            "city": {"type": "string", "description": "The city name, continued on a second line."},
            "days": {"type": "integer", "description": "How many days."},
            "units": {"type": "string", "enum": ["c", "f"], "description": "Celsius or Fahrenheit."},
            "tags": {"type": "array", "items": {"type": "string"}},
            "exact": {"type": "boolean"},
            "scale": {"type": "number"}}}}}


def test_builtin_tool_schemas():
    calc = BUILTIN_TOOLS["calculator"].schema["function"]
    assert calc["parameters"] == {"type": "object", "required": ["expression"], "properties": {"expression": {
        "type": "string", "description": 'Numbers with + - * / // % ** and parentheses, e.g. "(1234 + 5678) * 3".'}}}
    assert BUILTIN_TOOLS["python"].schema["function"]["parameters"]["required"] == ["code"]


def test_tool_schema_refuses_what_it_cannot_describe():
    def untyped(x):
        pass

    def star(*values: int):
        pass

    def odd(x: set):
        pass

    with pytest.raises(ValueError, match="tool 'untyped': parameter 'x' has no type hint"):
        tool_schema(untyped)
    with pytest.raises(ValueError, match=r"tool 'star': \*values parameters cannot be described"):
        tool_schema(star)
    with pytest.raises(ValueError, match="tool 'odd' parameter 'x': type <class 'set'> has no JSON-schema"):
        tool_schema(odd)


# --------------------------------------------------------------------------- the Hermes format


def test_hermes_parses_calls_and_reports_malformed_ones():
    hermes = tool_call_format("hermes")
    text = ('Let me compute.\n<tool_call>\n{"name": "calculator", "arguments": {"expression": "2+2"}}\n</tool_call>'
            '<tool_call>{"name": "lookup", "arguments": "{\\"city\\": \\"Oslo\\"}"}</tool_call>'
            '<tool_call>{"name": calculator}</tool_call>'
            '<tool_call>{"arguments": {}}</tool_call>'
            '<tool_call>{"name": "x", "arguments": [1]}</tool_call>'
            '<tool_call>{"name": "cut')
    calls = hermes.parse(text)
    assert calls[0] == ToolCall("calculator", {"expression": "2+2"})
    assert calls[1] == ToolCall("lookup", {"city": "Oslo"})
    assert calls[2].error.startswith("tool call is not valid JSON (Expecting value: line 1 column 10")
    assert calls[3].error.startswith('tool call must be a JSON object with a "name" string')
    assert calls[4].error == "tool 'x': \"arguments\" must be a JSON object"
    assert calls[5].error == "unterminated <tool_call> (no </tool_call>)"
    assert len(calls) == 6
    assert hermes.parse("The answer is 4.") == []


def test_hermes_round_trips_its_own_calls_and_lists_the_tools():
    hermes = tool_call_format("hermes")
    written = hermes.format_call("calculator", {"expression": "6*7"})
    assert written == '<tool_call>\n{"name": "calculator", "arguments": {"expression": "6*7"}}\n</tool_call>'
    assert hermes.parse(written) == [ToolCall("calculator", {"expression": "6*7"})]
    prompt = hermes.system_prompt([BUILTIN_TOOLS["calculator"].schema])
    assert f"<tools>\n{json.dumps(BUILTIN_TOOLS['calculator'].schema)}\n</tools>" in prompt
    assert hermes.stop_strings == ("</tool_call>",)


def test_unknown_format_lists_the_known_ones():
    with pytest.raises(ValueError, match="unknown tool-call format 'xml'; registered: hermes"):
        tool_call_format("xml")


# --------------------------------------------------------------------------- running calls


def divide(a: int, b: int) -> float:
    """Divide."""
    return a / b


def slow(seconds: float) -> str:
    """Sleep."""
    time.sleep(seconds)
    return "woke"


def listing(n: int) -> list:
    """A list."""
    return list(range(n))


TOOLS = {tool.name: tool for tool in (as_tool(divide), as_tool(slow, timeout=0.3), as_tool(listing))}


def test_tool_results_and_every_failure_become_text():
    assert run_tool_call(ToolCall("divide", {"a": 7, "b": 2}), TOOLS)[:2] == ("3.5", False)
    assert run_tool_call(ToolCall("listing", {"n": 3}), TOOLS)[:2] == ("[0, 1, 2]", False)
    cases = [
        (ToolCall("divide", {"a": 1, "b": 0}), "Error: tool 'divide' raised ZeroDivisionError: division by zero"),
        (ToolCall("search", {"q": "x"}), "Error: unknown tool 'search' (available: divide, listing, slow)"),
        (ToolCall("divide", {"a": 1}), "Error: tool 'divide': bad arguments (missing a required argument: 'b')"),
        (ToolCall("divide", {"a": 1, "b": 2, "c": 3}), "Error: tool 'divide': bad arguments (got an unexpected "
                                                       "keyword argument 'c')"),
        (ToolCall("", {}, "tool call is not valid JSON"), "Error: tool call is not valid JSON"),
    ]
    for call, expected in cases:
        result = run_tool_call(call, TOOLS)
        assert (result.content, result.error) == (expected, True)


def test_a_tool_that_hangs_times_out_as_an_error_observation():
    start = time.perf_counter()
    result = run_tool_call(ToolCall("slow", {"seconds": 5}), TOOLS)
    assert time.perf_counter() - start < 1.5
    assert (result.content, result.error) == ("Error: tool 'slow' timed out after 0.3 s", True)
    assert 0.3 <= result.seconds < 1.5


def test_a_long_result_is_cut():
    result = run_tool_call(ToolCall("listing", {"n": 5000}), TOOLS)
    assert len(result.content) < 4100 and result.content.endswith("more characters cut]")


# --------------------------------------------------------------------------- calculator


@pytest.mark.parametrize("expression, value", [
    ("(1234 + 5678) * 3", "20736"), ("12345 * 6789", "83810205"), ("7 / 2", "3.5"), ("17 // 5", "3"),
    ("-7 % 3", "2"), ("2 ** -1", "0.5"), ("2 ** 100", "1267650600228229401496703205376"), ("-(3 - 10)", "7"),
    ("6 / 3", "2"), ("0.1 + 0.2", "0.30000000000000004"), (" 99999 * 99999 ", "9999800001"),
])
def test_calculator_values(expression, value):
    assert calculator(expression) == value


@pytest.mark.parametrize("expression, error", [
    ("__import__('os').system('true')", "a Call expression is not allowed"),
    ("x + 1", "the name 'x' is not allowed"),
    ("(1).real", "a Attribute expression is not allowed"),
    ("'a' * 3", "the constant 'a' is not allowed"),
    ("[1, 2]", "a List expression is not allowed"),
    ("1 < 2", "a Compare expression is not allowed"),
    ("True + 1", "the constant True is not allowed"),
    ("lambda: 1", "a Lambda expression is not allowed"),
    ("2 ** 5000", "exponent 5000 is larger than 1000"),
    ("9 ** 999 * 9 ** 999", "result has more than 1000 digits"),
    ("99999 ** 999", "result has more than 1000 digits"),
    ("1 / 0", "division by zero"), ("5 % 0", "division by zero"),
    ("(-8) ** 0.5", "result is not a real number"),
    ("1e308 * 10", "result too large"),
    ("1 +", "not an arithmetic expression"),
    ("1" * 501, "longer than 500 characters"),
    ("-" * 400 + "1", None),
])
def test_calculator_refuses_anything_but_bounded_arithmetic(expression, error):
    if error is None:  # deep but legal nesting still evaluates
        assert calculator(expression) == "1"
        return
    with pytest.raises(CalculatorError, match=error):
        calculator(expression)


def test_calculator_error_reaches_the_policy_as_text():
    result = run_tool_call(ToolCall("calculator", {"expression": "1/0"}), BUILTIN_TOOLS)
    assert result[:2] == ("Error: tool 'calculator' raised CalculatorError: division by zero", True)


# --------------------------------------------------------------------------- ToolEnvironment


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
    assert result.metrics["tool_time"] >= 0

    bad = checked_step(env, "<tool_call>{not json}</tool_call>")
    assert bad.observation[0]["content"].startswith("Error: tool call is not valid JSON")
    assert not bad.done and bad.metrics["tool_errors"] == 1

    final = checked_step(env, " 6170")
    assert final == StepResult([], 1.0, True, {}) and answers == [(" 6170", "6170")]


def test_tool_environment_row_tools_and_limits():
    env = ToolEnvironment(tools=["calculator", divide], max_calls_per_turn=1)
    system = checked_reset(env, {"input": ["hi", "hello", "add"], "tools": ["divide"]})
    assert '"name": "divide"' in system[0]["content"] and '"name": "calculator"' not in system[0]["content"]
    assert [m["role"] for m in system] == ["system", "user", "assistant", "user"]
    result = checked_step(env, '<tool_call>{"name": "calculator", "arguments": {"expression": "1"}}</tool_call>'
                               '<tool_call>{"name": "divide", "arguments": {"a": 1, "b": 4}}</tool_call>')
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
