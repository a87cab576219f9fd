"""The calculator task's rules shared by both agents: the call budget, the calculator tool and the reward.

Kept apart from ``calc_agent.py`` so the plain OpenAI agent (``calc_openai_agent.py``) uses them without importing
LangChain and LangGraph (about a second of CPU per runner process).
"""

from __future__ import annotations

import re

MAX_LLM_CALLS = 2
_ANSWER = re.compile(r"^A:(-?\d+)$")
_EXPRESSION = re.compile(r"^[0-9+\-*() ]{1,64}$")


def evaluate(expression: str) -> str:
    """The calculator's answer: the integer value of ``expression``, or "E" for anything it cannot evaluate."""
    if not _EXPRESSION.match(expression):
        return "E"
    try:
        value = eval(expression, {"__builtins__": {}}, {})  # only digits and + - * ( ) reach here
    except Exception:
        return "E"
    return str(int(value))


def score_text(text: str, expected: int) -> float:
    """1 for ``A:<expected>``, 0 for another ``A:<number>``, -0.1 for anything else (the recipe's reward)."""
    match = _ANSWER.match(text.strip())
    if match is None:
        return -0.1
    return 1.0 if int(match.group(1)) == expected else 0.0
