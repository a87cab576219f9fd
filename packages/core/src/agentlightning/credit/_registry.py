"""A small name -> function registry shared by credit strategies and advantage estimators."""

from __future__ import annotations

from collections.abc import Callable
from typing import Generic, TypeVar

__all__ = ["Registry"]

_F = TypeVar("_F", bound=Callable[..., object])


class Registry(Generic[_F]):
    """Functions by name, with a clear error for unknown names and for accidental re-registration."""

    def __init__(self, what: str, aliases: dict[str, str] | None = None) -> None:
        self._what = what
        self._items: dict[str, _F] = {}
        self._aliases = dict(aliases or {})  # another spelling -> the registered name (not listed in `names`)

    def register(self, name: str, *, replace: bool = False) -> Callable[[_F], _F]:
        """Decorator registering a function under ``name``."""
        if not name or not isinstance(name, str):  # pyright: ignore[reportUnnecessaryIsInstance]
            raise ValueError(f"a {self._what} needs a non-empty string name, got {name!r}")

        def decorator(fn: _F) -> _F:
            if not callable(fn):  # pyright: ignore[reportUnnecessaryComparison]
                raise TypeError(f"{self._what} {name!r} must be callable, got {fn!r}")
            if name in self._items and not replace and self._items[name] is not fn:
                raise ValueError(f"a {self._what} named {name!r} is already registered; pass replace=True")
            self._items[name] = fn
            return fn

        return decorator

    def canonical(self, name: str) -> str:
        """The registered name ``name`` stands for (itself unless it is an alias)."""
        return self._aliases.get(name, name)

    def get(self, name: str) -> _F:
        """The function registered as ``name`` (or an alias of it); ``ValueError`` listing the known names otherwise."""
        try:
            return self._items[self._aliases.get(name, name)]
        except KeyError:
            known = ", ".join(sorted(self._items)) or "none"
            raise ValueError(f"unknown {self._what} {name!r}; registered: {known}") from None

    def names(self) -> list[str]:
        """Registered names, sorted."""
        return sorted(self._items)
