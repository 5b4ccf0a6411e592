"""The calculator tool of the ``math`` task: its OpenAI tool schema and a safe evaluator.

Expressions are parsed with :mod:`ast` and only numbers, ``+ - * / // % **``, unary signs and
parentheses are evaluated; there is no ``eval``, no names, no calls, no attribute access.
Exponents and magnitudes are bounded so a model cannot stall the agent with ``9**9**9``.
A bad expression is an error *result* (a string the model reads back), never an exception
escaping :func:`run_calculator`.
"""

from __future__ import annotations

import ast
import json
import operator
from typing import Any

__all__ = ["CALCULATOR_TOOL", "CalculatorError", "evaluate", "run_calculator"]

CALCULATOR_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "calculator",
        "description": "Evaluate an arithmetic expression with + - * / and parentheses.",
        "parameters": {
            "type": "object",
            # the pattern: digits and operators only (a constrained call cannot write prose into it)
            "properties": {"expression": {"type": "string", "description": "e.g. 12 + 7 * 3",
                                          "pattern": "^[0-9][0-9 +*/().-]{0,39}$"}},
            "required": ["expression"],
        },
    },
}

MAX_LEN = 200
MAX_ABS = 1e12
MAX_EXP = 64

_BINOPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
           ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow}
_UNOPS = {ast.UAdd: operator.pos, ast.USub: operator.neg}


class CalculatorError(ValueError):
    """The expression is not plain bounded arithmetic (the message says why)."""


def _eval(node: ast.AST) -> float | int:
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return node.value
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNOPS:
        return _UNOPS[type(node.op)](_eval(node.operand))
    if isinstance(node, ast.BinOp) and type(node.op) in _BINOPS:
        left, right = _eval(node.left), _eval(node.right)
        if isinstance(node.op, ast.Pow) and abs(right) > MAX_EXP:
            raise CalculatorError(f"exponent {right} is too large")
        try:
            value = _BINOPS[type(node.op)](left, right)
        except ZeroDivisionError as exc:
            raise CalculatorError("division by zero") from exc
        if isinstance(value, complex) or abs(value) > MAX_ABS:
            raise CalculatorError("result out of range")
        return value
    raise CalculatorError(f"unsupported syntax: {type(node).__name__}")


def evaluate(expression: str) -> int | float:
    """The value of a plain arithmetic expression; ``×``, ``÷``, ``^`` and a trailing ``=`` are accepted."""
    text = expression.strip().rstrip("=").replace("×", "*").replace("÷", "/").replace("^", "**").replace(",", "")
    if not text or len(text) > MAX_LEN:
        raise CalculatorError("empty or too long expression")
    try:
        tree = ast.parse(text, mode="eval")
    except (SyntaxError, ValueError) as exc:
        raise CalculatorError(f"not an arithmetic expression: {text!r}") from exc
    value = _eval(tree.body)
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return round(value, 6) if isinstance(value, float) else value


def run_calculator(arguments: Any) -> tuple[str, bool]:
    """Run one tool call: ``arguments`` is a dict or its JSON text. Returns (result text, ok).

    ``ok`` is True only for a well-formed call: a JSON object with a string (or number)
    ``expression`` that evaluates. Anything else returns ``("error: ...", False)``.
    """
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except ValueError:
            return "error: arguments are not valid JSON", False
    if not isinstance(arguments, dict) or "expression" not in arguments:
        return 'error: expected {"expression": "<arithmetic>"}', False
    expression = arguments["expression"]
    if isinstance(expression, bool) or not isinstance(expression, (str, int, float)):
        return "error: expression must be a string", False
    try:
        return str(evaluate(str(expression))), True
    except CalculatorError as exc:
        return f"error: {exc}", False
