"""The rollout lifecycle is written once: its decisions in `_lifecycle`, their SQL in `_sql_lifecycle`, and neither
SQL dialect imports the other's modules (row helpers live in the neutral `_sql_rows`)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from agentlightning.store import RetryPolicy
from agentlightning.store._lifecycle import (
    after_attempt,
    attempt_deadline,
    no_timeout_before,
)

STORE = Path(__file__).resolve().parents[1] / "src" / "agentlightning" / "store"

# decision -> the one module that may define it
DECISIONS = {
    name: "_lifecycle.py"
    for name in (
        "rollout_status_after",
        "after_attempt",
        "timed_out_status",
        "attempt_deadline",
        "no_timeout_before",
        "finish_is_repeat",
        "cancel_is_repeat",
        "not_running",
        "start_attempt",
    )
}
# what each SQL store did on its own before: end an attempt, find and apply timeouts, finish, release, cancel
DECISIONS.update(
    {
        name: "_sql_lifecycle.py"
        for name in ("_end_attempt", "_expired", "_apply_timeouts", "_finish", "_release", "_cancel", "_claim_of")
    }
)
# the texts of the lifecycle's refusals: one place says them
MESSAGES = ("cannot finish it as", "cannot cancel it", ", not running")
ROW_HELPERS = ("ROLLOUT_COLUMNS", "ATTEMPT_COLUMNS", "rollout_from_row", "attempt_from_row", "dump_json")


def _modules() -> dict[str, ast.Module]:
    return {path.name: ast.parse(path.read_text(), str(path)) for path in sorted(STORE.glob("*.py"))}


def _imported(tree: ast.Module) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
    return names


def _defined(tree: ast.Module) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
    return names


def _dialect(module: str) -> str | None:
    """``sqlite`` / ``postgres`` for a module of one dialect (``agentlightning.store._sqlite_schema`` or
    ``_sqlite_schema.py``), else ``None``."""
    stem = module.rsplit(".", 1)[-1].removesuffix(".py")
    for dialect in ("sqlite", "postgres"):
        if stem.startswith(f"_{dialect}"):
            return dialect
    return None


def test_no_sql_dialect_imports_the_other_and_shared_sql_modules_import_neither() -> None:
    found: list[str] = []
    for name, tree in _modules().items():
        own = _dialect(name)
        shared = name.startswith(("_sql_", "_lifecycle"))
        for module in _imported(tree):
            if not module.startswith("agentlightning.store._"):
                continue
            other = _dialect(module.split(".")[2])
            if other is not None and (shared or (own is not None and other != own)):
                found.append(f"{name} imports {module}")
    assert not found, "a SQL dialect's module is imported outside its dialect: " + "; ".join(sorted(found))


def test_row_helpers_are_defined_once_in_a_module_neither_dialect_owns() -> None:
    owners = {helper: [n for n, tree in _modules().items() if helper in _defined(tree)] for helper in ROW_HELPERS}
    assert owners == {helper: ["_sql_rows.py"] for helper in ROW_HELPERS}


def test_each_lifecycle_decision_is_defined_in_one_module() -> None:
    modules = _modules()
    owners = {name: sorted(n for n, tree in modules.items() if name in _defined(tree)) for name in DECISIONS}
    assert owners == {name: [module] for name, module in DECISIONS.items()}


@pytest.mark.parametrize("message", MESSAGES)
def test_each_lifecycle_refusal_is_worded_in_one_module(message: str) -> None:
    holders = sorted(
        name
        for name, tree in _modules().items()
        if any(isinstance(n, ast.Constant) and isinstance(n.value, str) and message in n.value for n in ast.walk(tree))
    )
    assert holders == ["_lifecycle.py"]


def test_the_shared_decisions() -> None:
    policy = RetryPolicy(max_attempts=2, heartbeat_timeout=10.0, rollout_timeout=100.0)
    assert after_attempt(policy, "failed", 1) == ("queuing", 1)
    assert after_attempt(policy, "failed", 2) == ("failed", 0)
    assert after_attempt(policy, "succeeded", 1) == ("succeeded", 0)
    assert attempt_deadline(policy, start_time=0.0, last_heartbeat=95.0) == 100.0
    assert attempt_deadline(policy, start_time=0.0, last_heartbeat=50.0) == 60.0
    # nothing runs: nothing can time out sooner than the shortest timeout from now
    assert no_timeout_before(policy, 1000.0, None, None) == 1010.0
    assert no_timeout_before(policy, 1000.0, 995.0, 950.0) == 1005.0
    assert no_timeout_before(policy, 1000.0, 999.0, 905.0) == 1005.0
