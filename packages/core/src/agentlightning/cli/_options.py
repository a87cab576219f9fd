"""Options several ``agl`` commands share, parsed the same way in each."""

from __future__ import annotations

import argparse

__all__ = ["LOG_LEVELS", "add_log_level_argument", "log_level"]

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
