"""The calculator task's rules shared by both agents: the call budget, the calculator tool and the reward.

Kept apart from ``calc_agent.py`` so the plain OpenAI agent (``calc_openai_agent.py``) uses them without importing
LangChain and LangGraph (about a second of CPU per runner process).
"""

from __future__ import annotations

import ast
import json
import os
import re
from pathlib import Path
from typing import Any

MAX_LLM_CALLS = 2
PROMPT_ENV = "CALC_PROMPT_FILE"
"""The environment variable naming a JSON file of messages that open every conversation (``prompt_messages``)."""
TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": "calculator",
            "description": "Evaluate an arithmetic expression made of integers, + - * and parentheses.",
            "parameters": {
                "type": "object",
                "properties": {"expression": {"type": "string"}},
                "required": ["expression"],
            },
        },
    }
]
"""The calculator tool as the OpenAI API declares it (the plain agent sends it; the bare loops render it)."""
_ANSWER = re.compile(r"^A:(-?\d+)$")
_EXPRESSION = re.compile(r"^[0-9+\-*() ]{1,64}$")
MAX_OPERAND = 10**6
"""The largest operand the calculator takes: the tasks' operands are 2-99 (a policy's typo stays well inside)."""
MAX_VALUE = 10**12
"""The largest magnitude of any value the calculator computes: three operands of the tasks' size stay under 10^6."""


def evaluate(expression: str) -> str:
    """The calculator's answer: the integer value of ``expression``, or "E" for anything it cannot evaluate.

    An integer expression of ``+ - *`` and brackets, walked node by node (no ``eval``): an operand over `MAX_OPERAND`
    or any value (intermediate too) over `MAX_VALUE` in magnitude is "E" before it is computed, and so is any other
    operator (``**`` included: ``9**9**9`` would hold the interpreter for minutes). It never raises.
    """
    try:
        if not _EXPRESSION.match(expression):
            return "E"
        return str(_value(ast.parse(expression, mode="eval").body))
    except Exception:  # a SyntaxError, an operand or a value out of bounds, anything else: the model reads "E"
        return "E"


def _value(node: ast.AST) -> int:
    """The value of one node of a parsed expression; `ValueError` for anything outside the calculator's bounds."""
    if isinstance(node, ast.Constant) and type(node.value) is int:
        if node.value > MAX_OPERAND:
            raise ValueError(f"operand over {MAX_OPERAND}")
        return node.value
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub | ast.UAdd):
        operand = _value(node.operand)
        return -operand if isinstance(node.op, ast.USub) else operand
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add | ast.Sub | ast.Mult):
        left, right = _value(node.left), _value(node.right)
        # Both sides are within MAX_VALUE, so even their product is a small computation; checked before it is kept.
        value = (
            left + right
            if isinstance(node.op, ast.Add)
            else left - right
            if isinstance(node.op, ast.Sub)
            else left * right
        )
        if abs(value) > MAX_VALUE:
            raise ValueError(f"a value over {MAX_VALUE}")
        return value
    raise ValueError(f"not an integer expression of + - * and brackets: {type(node).__name__}")


def score_text(text: str, expected: int) -> float:
    """1 for ``A:<expected>``, 0 for another ``A:<number>``, -0.1 for anything else (the recipe's reward)."""
    match = _ANSWER.match(text.strip())
    if match is None:
        return -0.1
    return 1.0 if int(match.group(1)) == expected else 0.0


def prompt_messages() -> list[dict[str, Any]]:
    """The messages that open every conversation before the question: none by default (the toy model needs none).

    A model that was not made for this task gets them from a JSON file named by ``$CALC_PROMPT_FILE``: a list of
    OpenAI chat messages, e.g. a system prompt that describes the calculator and the answer format, and a worked
    example (``prompts/smollm2.json``). ``train.py --model smollm2`` sets it for its runner processes.
    """
    path = os.environ.get(PROMPT_ENV)
    if not path:
        return []
    messages = json.loads(Path(path).read_text(encoding="utf-8"))
    if not isinstance(messages, list) or not all(isinstance(m, dict) and "role" in m for m in messages):  # pyright: ignore[reportUnknownVariableType]
        raise ValueError(f"${PROMPT_ENV} ({path}) must hold a JSON list of chat messages")
    return messages  # pyright: ignore[reportUnknownVariableType]
