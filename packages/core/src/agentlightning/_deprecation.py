"""Deprecated names: one helper that warns, so every renamed public name says the same thing the same way.

A rename keeps the old public name for a stated time: reading or passing it works and emits a `DeprecationWarning`
that names the new spelling and the version that removes the old one, attributed to the user's line (not to
pydantic's or ours). Every deprecated name and its removal version is listed in ``CHANGELOG.md`` ("Deprecated");
``tests/test_code_rules.py`` fails on a deprecation without a removal version or past it.
"""

from __future__ import annotations

import inspect
import os
import warnings

__all__ = ["warn_renamed"]

_OURS = os.path.dirname(os.path.abspath(__file__))
_PYDANTIC_MARK = f"{os.sep}pydantic"


def _stacklevel() -> int:
    """The stack level of the first frame outside this package and pydantic (the user's code)."""
    frame = inspect.currentframe()
    level = 0
    while frame is not None:
        filename = frame.f_code.co_filename
        if not filename.startswith(_OURS) and _PYDANTIC_MARK not in filename and not filename.startswith("<"):
            return max(level, 1)
        frame = frame.f_back
        level += 1
    return 2


def warn_renamed(old: str, new: str, *, removed_in: str) -> None:
    """Warn that ``old`` is a deprecated name of ``new`` (a `DeprecationWarning` pointing at the caller's line).

    Args:
        old: The deprecated spelling, as the user wrote it (``"Transition.prompt_ids"``).
        new: What to write instead.
        removed_in: The version that removes ``old`` (``"0.3.0"``); also in ``CHANGELOG.md``.
    """
    message = f"{old} is deprecated: use {new} (same meaning); it is removed in {removed_in}"
    warnings.warn(message, DeprecationWarning, stacklevel=_stacklevel())
