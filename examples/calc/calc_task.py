"""The calculator task of the CPU quickstart: questions, a safe evaluator, and the reward.

A task reads ``Q:37*48+12=`` (three operands 2-99, at least one ``*``). The policy answers ``A:<n>``
directly, or calls the calculator with ``CALC(<expr>)``, reads ``R:<value>`` and then answers.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass

__all__ = [
    "CALCULATOR_TOOL",
    "MALFORMED_REWARD",
    "CalcTask",
    "evaluate_expression",
    "make_calc_tasks",
    "parse_answer",
    "score_answer",
]

MALFORMED_REWARD = -0.1
"""Reward for a final output that is not ``A:<integer>``."""

CALCULATOR_TOOL: dict[str, object] = {
    "type": "function",
    "function": {
        "name": "calculator",
        "description": "Evaluate an integer arithmetic expression with + - * and brackets.",
        "parameters": {
            "type": "object",
            "properties": {"expression": {"type": "string", "description": "e.g. 37*48+12"}},
            "required": ["expression"],
        },
    },
}
"""The OpenAI tool declaration of the calculator; the chat template renders its calls as ``CALC(<expr>)``."""

_ANSWER = re.compile(r"A:(-?\d{1,12})")
_MAX_EXPRESSION_CHARS = 64
_DIGITS = frozenset("0123456789")
_MAX_MAGNITUDE = 10**12


@dataclass(frozen=True)
class CalcTask:
    """One calculator question.

    Attributes:
        expression: The arithmetic, e.g. ``37*48+12``.
        answer: Its integer value.
    """

    expression: str
    answer: int

    @property
    def question(self) -> str:
        """The user message: ``Q:<expression>=``."""
        return f"Q:{self.expression}="

    def to_dict(self) -> dict[str, object]:
        """A JSON-friendly form (what a rollout's ``input`` holds)."""
        return {"question": self.question, "expression": self.expression, "answer": self.answer}


def make_calc_tasks(count: int, seed: int) -> list[CalcTask]:
    """Draw ``count`` tasks deterministically from ``seed``: three operands 2-99, at least one ``*``.

    Raises:
        ValueError: If ``count`` is negative.
    """
    if count < 0:
        raise ValueError(f"count must be >= 0, got {count}")
    rng = random.Random(seed)
    tasks: list[CalcTask] = []
    for _ in range(count):
        operands = [rng.randint(2, 99) for _ in range(3)]
        operators = [rng.choice("+-*") for _ in range(2)]
        if "*" not in operators:
            operators[rng.randrange(2)] = "*"
        expression = f"{operands[0]}{operators[0]}{operands[1]}{operators[1]}{operands[2]}"
        value = evaluate_expression(expression)
        assert value is not None  # generated expressions are always well formed
        tasks.append(CalcTask(expression, value))
    return tasks


def evaluate_expression(expression: str) -> int | None:
    """Evaluate integer arithmetic with ``+ - *`` and brackets without ``eval``; ``None`` if it is malformed.

    Expressions longer than 64 characters, or whose value or intermediate values exceed 10^12 in magnitude, are
    refused (``None``) so a policy cannot make the environment do unbounded work.
    """
    if not expression or len(expression) > _MAX_EXPRESSION_CHARS:
        return None
    parser = _Parser(expression)
    try:
        value = parser.expression()
    except _ParseError:
        return None
    return value if parser.position == len(expression) else None


def parse_answer(text: str) -> int | None:
    """The integer of a well-formed final answer ``A:<n>`` (whole text), else ``None``."""
    match = _ANSWER.fullmatch(text.strip())
    return int(match.group(1)) if match else None


def score_answer(text: str, expected: int) -> float:
    """Reward of a final output: 1.0 if it is ``A:<expected>``, 0.0 for another integer, -0.1 if malformed."""
    value = parse_answer(text)
    if value is None:
        return MALFORMED_REWARD
    return 1.0 if value == expected else 0.0


class _ParseError(Exception):
    pass


class _Parser:
    """Recursive descent over ``expr := term (('+'|'-') term)*``, ``term := atom ('*' atom)*``."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.position = 0

    def _peek(self) -> str:
        return self.text[self.position] if self.position < len(self.text) else ""

    @staticmethod
    def _check(value: int) -> int:
        if abs(value) > _MAX_MAGNITUDE:
            raise _ParseError("value out of range")
        return value

    def expression(self) -> int:
        value = self.term()
        while self._peek() in ("+", "-"):
            operator = self._peek()
            self.position += 1
            rhs = self.term()
            value = self._check(value + rhs if operator == "+" else value - rhs)
        return value

    def term(self) -> int:
        value = self.atom()
        while self._peek() == "*":
            self.position += 1
            value = self._check(value * self.atom())
        return value

    def atom(self) -> int:
        char = self._peek()
        if char == "(":
            self.position += 1
            value = self.expression()
            if self._peek() != ")":
                raise _ParseError("missing )")
            self.position += 1
            return value
        if char == "-":
            self.position += 1
            return -self.atom()
        start = self.position
        while self._peek() in _DIGITS:
            self.position += 1
        if start == self.position or self.position - start > 12:
            raise _ParseError("expected a number")
        return self._check(int(self.text[start : self.position]))
