"""`KitGuard`: a kit's tests cannot be silently overridden by the package that runs the kit.

A subclass may replace a kit test only to mark it expected to fail, with a reason::

    @pytest.mark.xfail(reason="the framework reports no tool calls")
    async def test_trace_tree(self, ...): ...

The guard test ``test_no_overrides_DO_NOT_OVERRIDE`` fails for any other override (as in LangChain's standard
tests), and defining the guard itself in a subclass fails at class creation.
"""

from __future__ import annotations

from typing import Any

__all__ = ["KitGuard", "silent_overrides"]

_GUARD = "test_no_overrides_DO_NOT_OVERRIDE"


def _is_kit(cls: type) -> bool:
    return cls.__module__.startswith("agentlightning.testing.") and cls is not KitGuard


def _has_xfail_reason(function: Any) -> bool:
    marks = getattr(function, "pytestmark", None) or []
    return any(getattr(m, "name", None) == "xfail" and str(m.kwargs.get("reason") or "").strip() for m in marks)


def silent_overrides(suite: type) -> list[str]:
    """Names of kit tests that ``suite`` (a subclass of a kit) replaces without an xfail marker with a reason."""
    found: list[str] = []
    for kit in (c for c in suite.__mro__ if _is_kit(c)):
        for name, original in vars(kit).items():
            if not name.startswith("test_") or not callable(original):
                continue
            current = getattr(suite, name, None)
            if current is not original and name not in found and not _has_xfail_reason(current):
                found.append(name)
    return sorted(found)


class KitGuard:
    """Base class of the shipped test kits; see the module docstring."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if not _is_kit(cls) and _GUARD in vars(cls):
            raise TypeError(f"{cls.__qualname__} overrides {_GUARD}, the guard of the test kit; remove it")

    def test_no_overrides_DO_NOT_OVERRIDE(self) -> None:
        """Every kit test this suite replaces is marked ``xfail`` with a reason."""
        silent = silent_overrides(type(self))
        assert not silent, (
            f"{type(self).__qualname__} overrides kit tests {silent}; a kit test may only be replaced to mark it "
            "@pytest.mark.xfail(reason=...) — use the capability flags or fixtures to adapt the kit instead"
        )
