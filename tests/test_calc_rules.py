"""examples/calc/calc_rules.py: the calculator tool both calc agents call computes what its pattern claims and
nothing more (a policy writes its expressions: ``9**9**9`` held the runner's interpreter for minutes)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

CALC = Path(__file__).resolve().parent.parent / "examples" / "calc"
sys.path.insert(0, str(CALC))
try:
    from calc_rules import MAX_VALUE, evaluate  # pyright: ignore[reportMissingImports]
finally:
    sys.path.remove(str(CALC))

HOSTILE = [
    "9**9**9",  # 9^387,420,489: minutes of big-int arithmetic holding the GIL
    "9**9**9**9",  # never returns
    "(10**12)*(10**12)",
    "99**999",  # a value whose str() raised "Exceeds the limit (4300 digits)" outside the old try
    "999999*999999*999999",  # operands in bounds, the value is not
    "1000001*2",  # an operand over the bound
    "1" * 65,  # longer than the pattern admits
    "(" * 40 + "1" + ")" * 40,  # long and deeply nested
    "2 3",
    "7//2",
    "",
]


def test_hostile_expressions_are_E_at_once() -> None:
    # In a child process: on the old calculator the first expressions do not return for minutes (the GIL is held,
    # so no in-process timeout could stop them); the bound here is only how long the test waits for an answer.
    code = f"import json, sys; sys.path.insert(0, {str(CALC)!r}); from calc_rules import evaluate; "
    code += f"print(json.dumps([evaluate(e) for e in {HOSTILE!r}]))"
    try:
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False)
    except subprocess.TimeoutExpired:
        pytest.fail("the calculator did not answer the hostile expressions within 120 s")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == ["E"] * len(HOSTILE)


def test_the_tasks_arithmetic_still_computes() -> None:
    assert evaluate("37*48+12") == "1788"
    assert evaluate("(2 + 3) * 4") == "20"
    assert evaluate("-5*3") == "-15"
    assert evaluate("99*99*99") == str(99**3)
    assert evaluate("1000000*1000000") == str(MAX_VALUE)  # the bound itself is in
