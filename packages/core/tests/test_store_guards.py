"""The boundary's guard table covers the whole store protocol: no store method with arguments slips past unchecked.

`agentlightning.store._boundary.GUARDS` is keyed by method name. A method added to `LightningStore` without a guard
would reach every backend unchecked; a guard whose name no longer matches a method would guard nothing. These
tests name the method in either case, and check that every backend's methods are the guarded ones.
"""

from __future__ import annotations

import inspect
from typing import Any

from agentlightning.store import LightningStore, MemoryStore, PostgresStore, SqliteStore, StoreClient
from agentlightning.store._boundary import GUARDS, StoreBoundary

BACKENDS: tuple[type[Any], ...] = (MemoryStore, SqliteStore, PostgresStore, StoreClient)


def _protocol_methods() -> dict[str, inspect.Signature]:
    """Public method name -> signature, of every method the `LightningStore` protocol declares."""
    return {
        name: inspect.signature(member)
        for name, member in vars(LightningStore).items()
        if not name.startswith("_") and inspect.isfunction(member)
    }


def _takes_arguments(signature: inspect.Signature) -> bool:
    return len(signature.parameters) > 1  # more than ``self``


def _boundary_own(name: str) -> bool:
    """Whether `StoreBoundary` implements ``name`` itself, on top of guarded methods (``enqueue_rollout``)."""
    return inspect.isfunction(vars(StoreBoundary).get(name))


def test_every_store_method_with_arguments_has_a_guard() -> None:
    methods = _protocol_methods()
    assert {"add_spans", "dequeue_rollout", "stats"} <= set(methods)  # the protocol was read
    unguarded = sorted(
        name
        for name, sig in methods.items()
        if _takes_arguments(sig) and name not in GUARDS and not _boundary_own(name)
    )
    assert unguarded == [], (
        "store methods with arguments but no guard in agentlightning.store._boundary.GUARDS (add one; a backend "
        f"would get them unchecked): {unguarded}"
    )


def test_every_guard_guards_a_store_method_with_its_signature() -> None:
    """A guard keyed by a name the protocol no longer has guards nothing; one whose parameters differ from the
    method's would change what callers may pass."""
    methods = _protocol_methods()
    drifted = [f"{name}: no such method of LightningStore" for name in sorted(set(GUARDS) - set(methods))]

    async def backend(*args: Any, **kwargs: Any) -> None:
        del args, kwargs

    for name, guard in GUARDS.items():
        if name not in methods:
            continue
        guarded = inspect.signature(guard(backend))
        shape = [(p.name, p.kind, p.default) for p in guarded.parameters.values()]
        expected = [(p.name, p.kind, p.default) for p in methods[name].parameters.values()]
        if shape != expected:
            drifted.append(f"{name}: guard {guarded}, protocol {methods[name]}")
    assert drifted == [], "guards that do not match a store method:\n" + "\n".join(drifted)


def test_every_backend_runs_the_guarded_methods() -> None:
    """Each backend derives from `StoreBoundary`, and what it runs for a guarded name is the guard."""
    methods = _protocol_methods()
    bypassed: list[str] = []
    for cls in BACKENDS:
        assert issubclass(cls, StoreBoundary), f"{cls.__name__} does not derive from StoreBoundary"
        for name in methods:
            member = inspect.getattr_static(cls, name, None)
            if member is None:
                bypassed.append(f"{cls.__name__} has no {name}")
            elif name in GUARDS and not getattr(member, "__agl_guarded__", False):
                bypassed.append(f"{cls.__name__}.{name} is not the guarded method")
            elif _boundary_own(name) and member is not vars(StoreBoundary)[name]:
                bypassed.append(f"{cls.__name__}.{name} replaces StoreBoundary's checked {name}")
    assert bypassed == [], "\n".join(bypassed)
