"""Options several ``agl`` commands share, parsed the same way in each."""

from __future__ import annotations

import argparse
import re
import sys
from typing import Any

__all__ = [
    "LOG_LEVELS",
    "PlainConsole",
    "add_agent_command_arguments",
    "add_log_level_argument",
    "command_agent",
    "error_console",
    "log_level",
    "non_negative_int",
]

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


def add_agent_command_arguments(
    which: argparse.ArgumentParser | argparse._MutuallyExclusiveGroup,  # pyright: ignore[reportPrivateUsage]
    parser: argparse.ArgumentParser,
) -> None:
    """``--agent-command CMD`` (in ``which``, beside ``--agent``) and ``--agent-timeout`` (`command_agent`), as
    `agentlightning.cli.RunSpec` defines them (``agl runner`` takes them as ``agl train`` does)."""
    from agentlightning.cli._spec import RunSpec  # not at import: the spec's module parses --log-level with ours

    fields = RunSpec.model_fields
    which.add_argument("--agent-command", metavar="CMD", help=fields["agent_command"].description)
    parser.add_argument(
        "--agent-timeout", type=float, default=None, metavar="SECONDS", help=fields["agent_timeout"].description
    )


def command_agent(args: argparse.Namespace) -> Any:
    """The `agentlightning.CommandAgent` of ``--agent-command`` / ``--agent-timeout`` / ``--app-dir``.

    Raises:
        ValueError: An empty command, a program not found, a missing folder, a timeout that is not positive.
    """
    from agentlightning.runner import CommandAgent

    return CommandAgent(args.agent_command, cwd=args.app_dir, timeout=args.agent_timeout)


def non_negative_int(value: str) -> int:
    """An option's whole number of 0 or more (``--max-staleness``); argparse names the option on refusal."""
    try:
        number = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not a whole number") from None
    if number < 0:
        raise argparse.ArgumentTypeError(f"{value} is negative (use 0 or more)")
    return number
