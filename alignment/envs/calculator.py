"""The built-in `calculator` tool: arithmetic by walking the expression's syntax tree, never by evaluating code.

Allowed: int and float literals, + - * / // % **, unary + and -, parentheses. Anything else (names, calls,
attributes, strings, comparisons) is refused with a message naming what was found. Bounds keep a hostile
expression cheap: at most MAX_EXPRESSION_CHARS characters, |exponent| <= MAX_EXPONENT, and no integer result
longer than MAX_INT_DIGITS digits.
"""
from __future__ import annotations

import ast
import math
import operator
from typing import Callable, Dict, Union

Number = Union[int, float]

MAX_EXPRESSION_CHARS = 500
MAX_EXPONENT = 1000
MAX_INT_DIGITS = 1000
_MAX_INT = 10 ** MAX_INT_DIGITS

_BINARY: Dict[type, Callable[[Number, Number], Number]] = {
    ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow,
}
_UNARY: Dict[type, Callable[[Number], Number]] = {ast.USub: operator.neg, ast.UAdd: operator.pos}


class CalculatorError(ValueError):
    """The expression is not plain arithmetic, or its value is out of bounds."""


def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression exactly (integers stay integers).

    Args:
        expression: Numbers with + - * / // % ** and parentheses, e.g. "(1234 + 5678) * 3".
    """
    if not isinstance(expression, str):
        raise CalculatorError(f"expression must be a string, got {type(expression).__name__}")
    if len(expression) > MAX_EXPRESSION_CHARS:
        raise CalculatorError(f"expression longer than {MAX_EXPRESSION_CHARS} characters")
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except SyntaxError as err:
        raise CalculatorError(f"not an arithmetic expression ({err.msg})") from None
    except (RecursionError, MemoryError):
        raise CalculatorError("expression nested too deeply") from None
    try:
        return format_number(evaluate(tree.body))
    except RecursionError:
        raise CalculatorError("expression nested too deeply") from None


def evaluate(node: ast.AST) -> Number:
    """The value of an arithmetic syntax tree (see the module docstring for what is allowed)."""
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return node.value
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _UNARY[type(node.op)](evaluate(node.operand))
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = evaluate(node.left), evaluate(node.right)
        if isinstance(node.op, ast.Pow):
            _check_power(left, right)
        try:
            value = _BINARY[type(node.op)](left, right)
        except ZeroDivisionError:
            raise CalculatorError("division by zero") from None
        except OverflowError:
            raise CalculatorError("result too large") from None
        return _bounded(value)
    raise CalculatorError(f"{_describe(node)} is not allowed (numbers, + - * / // % ** and parentheses only)")


def _check_power(base: Number, exponent: Number) -> None:
    """Refuse a power before computing it when its size alone would be too costly."""
    if abs(exponent) > MAX_EXPONENT:
        raise CalculatorError(f"exponent {format_number(exponent)} is larger than {MAX_EXPONENT}")
    if isinstance(base, int) and isinstance(exponent, int) and abs(base) > 1 and exponent > 0:
        if exponent * math.log10(abs(base)) > MAX_INT_DIGITS + 1:
            raise CalculatorError(f"result has more than {MAX_INT_DIGITS} digits")


def _bounded(value) -> Number:
    if isinstance(value, complex):  # (-8) ** 0.5
        raise CalculatorError("result is not a real number")
    if isinstance(value, int) and abs(value) >= _MAX_INT:
        raise CalculatorError(f"result has more than {MAX_INT_DIGITS} digits")
    if isinstance(value, float) and not math.isfinite(value):
        raise CalculatorError("result too large")
    return value


def format_number(value: Number) -> str:
    """Integers as digits; floats without a trailing .0 when integral, else Python's shortest repr."""
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e16:
        return str(int(value))
    return repr(value)


def _describe(node: ast.AST) -> str:
    if isinstance(node, ast.Constant):
        return f"the constant {node.value!r}"
    if isinstance(node, ast.Name):
        return f"the name {node.id!r}"
    if isinstance(node, (ast.BinOp, ast.UnaryOp)):
        return f"the operator {type(node.op).__name__}"
    return f"a {type(node).__name__} expression"
