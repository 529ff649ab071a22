"""Tools without a model: schemas from type hints and docstrings, the Hermes tool-call format, running calls (every
failure an observation text) and the calculator's bounds."""
import json
import time
from typing import List, Literal, Optional

import pytest

from alignment.envs import BUILTIN_TOOLS, ToolCall, as_tool, calculator, run_tool_call, tool_call_format, tool_schema
from alignment.envs.calculator import CalculatorError

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
