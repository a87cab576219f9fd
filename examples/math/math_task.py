"""Arithmetic word problems for the AutoGen math example: a seeded generator, the reward, a GSM8K-format loader.

A generated problem reads like ``Her brother is 39. Ana has 8 boxes of 7 pens and gives away 5. How many pens
does she have?``: one of five templates (several operations: ``*``, ``+``, ``-``, brackets; numbers 2 to 9) after
one distractor sentence whose (two-digit) number must be ignored. Its gold calculator expression is ``8*7-5`` (the
numbers in the order the problem gives them) and its answer ``51``.
The reward is an exact numeric match of the last number of the agent's final message.

Real data: `load_gsm8k` reads GSM8K's JSONL (``{"question": ..., "answer": "... #### 72"}``) from a local file.
"""

from __future__ import annotations

import json
import random
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from pathlib import Path

__all__ = [
    "KINDS",
    "MathProblem",
    "answer_matches",
    "evaluate_expression",
    "load_gsm8k",
    "load_problems",
    "make_problems",
    "normalize_number",
    "parse_final_number",
    "score",
    "split_problems",
    "tasks_of",
]

_NAMES = (("Ana", "she", "Her"), ("Ben", "he", "His"), ("Cara", "she", "Her"), ("Dev", "he", "His"),
          ("Eva", "she", "Her"), ("Finn", "he", "His"), ("Gia", "she", "Her"), ("Hugo", "he", "His"))  # fmt: skip
_ITEMS = ("pens", "apples", "cards", "books", "eggs", "shells", "coins", "stickers")
_BOXES = ("boxes", "bags", "packs", "crates")

KINDS = ("give", "find", "trade", "shelves", "take")
"""The problem templates: ``a*b-c``, ``a*b+c``, ``a+b-c``, ``a*(b+c)``, ``a*(b-c)`` (a, b, c from 2 to 9)."""

_DISTRACTORS = (
    "{Poss} brother is {d}.",
    "It is {d} degrees outside.",
    "{name} lives at number {d}.",
    "The shop opened {d} years ago.",
)

_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")
_EXPRESSION_CHARS = frozenset("0123456789+-*/(). ")
_MAX_EXPRESSION_CHARS = 80


@dataclass(frozen=True)
class MathProblem:
    """One word problem.

    Attributes:
        question: The text the agent is given.
        answer: The gold answer as a normalised number string (``"69"``, ``"2.5"``).
        expression: The gold calculator expression (generated problems only).
        distractor: The number that must be ignored (generated problems only).
        kind: The template (one of `KINDS`), or ``"gsm8k"``.
    """

    question: str
    answer: str
    expression: str | None = None
    distractor: int | None = None
    kind: str = "gsm8k"

    def to_task(self) -> dict[str, str]:
        """What a rollout's input holds: ``{"question": ..., "answer": ...}``."""
        return {"question": self.question, "answer": self.answer}


def _draw(rng: random.Random) -> MathProblem:
    name, pronoun, possessive = rng.choice(_NAMES)
    items, box, kind = rng.choice(_ITEMS), rng.choice(_BOXES), rng.choice(KINDS)
    a, b, c = rng.randint(2, 9), rng.randint(2, 9), rng.randint(2, 9)
    if kind == "give":
        c = rng.randint(2, min(9, a * b - 1))  # keeps the answer positive
        body, expression = f"{name} has {a} {box} of {b} {items} and gives away {c}.", f"{a}*{b}-{c}"
    elif kind == "find":
        body, expression = f"{name} buys {a} {box} of {b} {items} and finds {c} more.", f"{a}*{b}+{c}"
    elif kind == "trade":
        c = rng.randint(2, min(9, a + b - 1))
        body, expression = f"{name} has {a} {items}, gets {b} more and loses {c}.", f"{a}+{b}-{c}"
    elif kind == "shelves":
        body = f"{name} fills {a} shelves with {b} red and {c} blue {items} each."
        expression = f"{a}*({b}+{c})"
    else:  # take
        b = rng.randint(3, 9)
        c = rng.randint(2, b - 1)
        body = f"{name} fills {a} {box} with {b} {items} each and takes {c} out of each."
        expression = f"{a}*({b}-{c})"
    d = rng.randint(10, 99)  # two digits: every problem of a kind has the same shape
    distractor = rng.choice(_DISTRACTORS).format(Poss=possessive, name=name, d=d)
    ask = f"How many {items} does {pronoun} have?"
    sentences = [distractor, body, ask]
    value = evaluate_expression(expression)
    assert value is not None  # generated expressions are well formed
    return MathProblem(" ".join(sentences), normalize_number(str(value)), expression, d, kind)


def make_problems(count: int, seed: int) -> list[MathProblem]:
    """Draw ``count`` problems deterministically from ``seed`` (repeats are possible; see `split_problems`).

    Raises:
        ValueError: If ``count`` is negative.
    """
    if count < 0:
        raise ValueError(f"count must be >= 0, got {count}")
    rng = random.Random(seed)
    return [_draw(rng) for _ in range(count)]


def split_problems(train_size: int, heldout_size: int, seed: int = 0) -> tuple[list[MathProblem], list[MathProblem]]:
    """A training set and a disjoint held-out set (no held-out question appears in training), each without repeats.

    Raises:
        ValueError: If a size is below 1.
    """
    if train_size < 1 or heldout_size < 1:
        raise ValueError(f"train and held-out sizes must be at least 1, got {train_size} and {heldout_size}")
    held_out = _unique(make_problems(heldout_size * 2, seed=seed * 2 + 1))[:heldout_size]
    seen = {p.question for p in held_out}
    train = _unique(p for p in make_problems(train_size * 2, seed=seed * 2) if p.question not in seen)[:train_size]
    return train, held_out


def _unique(problems: Iterable[MathProblem]) -> list[MathProblem]:
    seen: set[str] = set()
    out: list[MathProblem] = []
    for problem in problems:
        if problem.question not in seen:
            seen.add(problem.question)
            out.append(problem)
    return out


# ----- answers and reward -----------------------------------------------------------------------------------------


def normalize_number(text: str) -> str:
    """A number written as ``1,234``, ``$12``, ``-3.50`` or ``7.0`` in canonical form (``1234``, ``12``, ``-3.5``).

    Raises:
        ValueError: If ``text`` is not a number.
    """
    cleaned = text.strip().replace(",", "").removeprefix("$").rstrip(".")
    try:
        value = Decimal(cleaned)
    except InvalidOperation:
        raise ValueError(f"not a number: {text!r}") from None
    if not value.is_finite():
        raise ValueError(f"not a finite number: {text!r}")
    if value == value.to_integral_value():
        return str(int(value))
    return format(value.normalize(), "f")


def parse_final_number(text: str) -> str | None:
    """The last number written in ``text``, normalised (``"The answer is 1,234."`` -> ``"1234"``), or ``None``."""
    found = _NUMBER.findall(text)
    if not found:
        return None
    try:
        return normalize_number(found[-1])
    except ValueError:
        return None


def answer_matches(text: str, answer: str) -> bool:
    """Whether the last number in ``text`` equals ``answer`` exactly (as numbers: ``69.0`` matches ``69``)."""
    found = parse_final_number(text)
    return found is not None and Decimal(found) == Decimal(normalize_number(answer))


def score(final_text: str | None, answer: str) -> float:
    """The reward: 1.0 when the final message's last number is the answer, else 0.0 (no final message: 0.0)."""
    return 1.0 if final_text is not None and answer_matches(final_text, answer) else 0.0


def evaluate_expression(expression: str) -> int | float | None:
    """The value of an arithmetic expression (numbers, ``+ - * /``, brackets), or ``None`` if it is not one.

    Parsed with Python's ``ast`` and evaluated node by node (no ``eval``); long expressions, huge values and
    division by zero give ``None``.
    """
    import ast

    if not expression or len(expression) > _MAX_EXPRESSION_CHARS or not set(expression) <= _EXPRESSION_CHARS:
        return None
    try:
        tree = ast.parse(expression, mode="eval")
    except SyntaxError:
        return None

    def walk(node: ast.AST) -> int | float:
        if isinstance(node, ast.Expression):
            return walk(node.body)
        if isinstance(node, ast.Constant) and isinstance(node.value, int | float) and not isinstance(node.value, bool):
            return node.value
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub | ast.UAdd):
            value = walk(node.operand)
            return -value if isinstance(node.op, ast.USub) else value
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add | ast.Sub | ast.Mult | ast.Div):
            left, right = walk(node.left), walk(node.right)
            if isinstance(node.op, ast.Add):
                result = left + right
            elif isinstance(node.op, ast.Sub):
                result = left - right
            elif isinstance(node.op, ast.Mult):
                result = left * right
            else:
                result = left / right
            if abs(result) > 1e12:
                raise OverflowError
            return result
        raise ValueError("unsupported expression")

    try:
        value = walk(tree)
    except (ValueError, OverflowError, ZeroDivisionError):
        return None
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


# ----- files ------------------------------------------------------------------------------------------------------


def load_gsm8k(path: str | Path, limit: int | None = None) -> list[MathProblem]:
    """Problems from a GSM8K-format JSONL file: ``{"question": ..., "answer": "<solution> #### <number>"}`` lines.

    The gold answer is the number after the last ``####`` (commas and ``$`` removed).

    Raises:
        ValueError: A missing file, a line that is not JSON, lacks a field, or has no ``#### <number>``; or no
            problem at all. The message names the file and line.
    """
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"GSM8K file {str(path)!r} does not exist")
    problems: list[MathProblem] = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        where = f"{path}:{number}"
        try:
            row = json.loads(line)
        except json.JSONDecodeError as error:
            raise ValueError(f"{where}: not valid JSON ({error.msg} at column {error.colno})") from None
        if (
            not isinstance(row, dict)
            or not isinstance(row.get("question"), str)
            or not isinstance(row.get("answer"), str)
        ):
            raise ValueError(f"{where}: expected an object with string fields 'question' and 'answer'")
        solution: str = row["answer"]
        if "####" not in solution:
            raise ValueError(f"{where}: the answer has no '#### <number>' line")
        final = solution.rsplit("####", 1)[1].strip()
        try:
            answer = normalize_number(final)
        except ValueError:
            raise ValueError(f"{where}: the text after '####' is not a number: {final!r}") from None
        problems.append(MathProblem(question=row["question"].strip(), answer=answer))
        if limit is not None and len(problems) >= limit:
            break
    if not problems:
        raise ValueError(f"GSM8K file {str(path)!r} holds no problems")
    return problems


def load_problems(path: str | Path, limit: int | None = None) -> list[MathProblem]:
    """Problems from a JSONL file: GSM8K lines (``#### <number>`` answers) or plain ``{"question", "answer"}``.

    A plain answer may be a number or a number string.

    Raises:
        ValueError: As `load_gsm8k`, naming the file and line.
    """
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"problem file {str(path)!r} does not exist")
    lines = [line for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    if lines and "####" in lines[0]:
        return load_gsm8k(path, limit)
    problems: list[MathProblem] = []
    for number, line in enumerate(lines, start=1):
        try:
            row = json.loads(line)
            answer = row["answer"]
            if isinstance(answer, bool) or not isinstance(answer, int | float | str):
                raise TypeError
            problems.append(MathProblem(question=str(row["question"]), answer=normalize_number(str(answer))))
        except (json.JSONDecodeError, KeyError, TypeError, ValueError):
            raise ValueError(
                f'{path}: line {number}: expected {{"question": str, "answer": number}} or GSM8K\'s \'#### <n>\''
            ) from None
        if limit is not None and len(problems) >= limit:
            break
    if not problems:
        raise ValueError(f"problem file {str(path)!r} holds no problems")
    return problems


def tasks_of(problems: Sequence[MathProblem]) -> list[dict[str, str]]:
    """Rollout inputs of ``problems``."""
    return [p.to_task() for p in problems]
