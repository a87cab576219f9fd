"""Options several ``agl`` commands share, parsed the same way in each."""

from __future__ import annotations

import argparse
import re
import sys
from typing import Any

__all__ = ["LOG_LEVELS", "PlainConsole", "add_log_level_argument", "error_console", "log_level"]

LOG_LEVELS = ("debug", "info", "warning", "error", "critical")
"""The levels ``--log-level`` takes (any case), as `logging` and uvicorn name them."""

_ALIASES = {"warn": "warning", "fatal": "critical"}


def log_level(value: str) -> str:
    """``--log-level`` in any case (``debug``, ``DEBUG``, ``Warn``...), as its lower-case name (``warn``: ``warning``).

    Raises:
        argparse.ArgumentTypeError: Not a level; argparse then names the option and lists the levels.
    """
    name = value.strip().lower()
    name = _ALIASES.get(name, name)
    if name not in LOG_LEVELS:
        raise argparse.ArgumentTypeError(f"{value!r} is not a log level (use one of: {', '.join(LOG_LEVELS)})")
    return name


def add_log_level_argument(parser: argparse.ArgumentParser | argparse._ArgumentGroup, what: str = "logging") -> None:  # pyright: ignore[reportPrivateUsage]
    """Add ``--log-level`` (default ``warning``), parsed by `log_level`."""
    parser.add_argument(
        "--log-level",
        type=log_level,
        default="warning",
        metavar="LEVEL",
        help=f"{what} level: {', '.join(LOG_LEVELS)}, in any case (default: warning)",
    )


_MARKUP = re.compile(r"\[/?(?:bold|red|green|yellow|dim)(?: [a-z]+)*\]")


class PlainConsole:
    """What the runner prints, on stderr, where ``rich`` is not installed (an agent's process needs no ``serve``).

    It takes the same markup as ``rich`` and drops it (only the styles the CLI uses, so a literal ``[x]`` stays).
    """

    def print(self, message: str) -> None:
        """Write ``message`` without its markup, one line."""
        print(_MARKUP.sub("", message), file=sys.stderr, flush=True)


def error_console() -> Any:
    """A ``rich`` console on stderr, one line per message however long; a `PlainConsole` without ``rich``."""
    try:
        from rich.console import Console
    except ImportError:
        return PlainConsole()
    return Console(stderr=True, soft_wrap=True)
