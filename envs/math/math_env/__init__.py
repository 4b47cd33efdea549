"""Math word problems with a calculator tool. `calculate` is the calculator: arithmetic only, evaluated from
the syntax tree (no names, no calls), with bounded powers so a model cannot hang it."""

from __future__ import annotations

import ast
import math
import operator
from collections.abc import Callable

from rollout.contracts import ToolSpec

CALCULATOR_TOOL = ToolSpec(
    name="calculator",
    description="Evaluate an arithmetic expression: numbers, + - * / // % **, parentheses.",
    parameters={
        "type": "object",
        "properties": {"expression": {"type": "string", "description": "e.g. (14+2)*(9+2) - 14*9"}},
        "required": ["expression"],
    },
)

_BINARY: dict[type[ast.operator], Callable[[float, float], float]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}


class CalculatorError(ValueError):
    pass


def calculate(expression: str) -> float:
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except SyntaxError:
        raise CalculatorError(f"not an arithmetic expression: {expression[:80]!r}") from None
    except (MemoryError, RecursionError):  # the parser's own stack: thousands of nested signs or brackets
        raise CalculatorError("that expression is nested too deeply for this calculator") from None
    try:
        return _evaluate(tree.body)
    except RecursionError:
        raise CalculatorError("that expression is nested too deeply for this calculator") from None


def _evaluate(node: ast.expr) -> float:
    if (
        isinstance(node, ast.Constant)
        and isinstance(node.value, int | float)
        and not isinstance(node.value, bool)
    ):
        return node.value
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub | ast.UAdd):
        value = _evaluate(node.operand)
        return -value if isinstance(node.op, ast.USub) else value
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _evaluate(node.left), _evaluate(node.right)
        if isinstance(node.op, ast.Pow) and (abs(right) > 64 or abs(left) > 1e6):
            raise CalculatorError("that power is too large for this calculator")
        try:
            return _BINARY[type(node.op)](left, right)
        except ZeroDivisionError:
            raise CalculatorError("division by zero") from None
    raise CalculatorError(f"only numbers and + - * / // % ** are allowed, not {ast.unparse(node)!r}")


def number_text(value: float) -> str:
    """A result as people write it: 288, 32.5, 0.333333."""
    if math.isfinite(value) and float(value).is_integer():
        return str(int(value))
    return f"{value:.6f}".rstrip("0").rstrip(".")
