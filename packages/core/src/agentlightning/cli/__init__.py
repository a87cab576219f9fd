"""The ``agl`` command line: ``agl store serve``, ``agl proxy serve``, ``agl runner``.

Each command group lives in its own module and registers its sub-parsers through ``register(subparsers)``.
A program that starts ``agl`` commands as its helpers (a trainer's runners and store server) starts them with
`start_child` (runners: `start_runners`, awaited through `guarded`, stopped by `stop_children`), so that they end
when it does, whatever ends it.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from agentlightning._lifeline import start_child, watch_parent
from agentlightning._runner_pool import RunnerDied, cancel_on_sigterm, guarded, start_runners, stop_children
from agentlightning.cli._train import add_network_arguments

__all__ = [
    "RunnerDied",
    "add_network_arguments",
    "build_parser",
    "cancel_on_sigterm",
    "guarded",
    "main",
    "start_child",
    "start_runners",
    "stop_children",
]

# Command modules, each exposing ``register(subparsers)``; a sub-parser sets ``func(args) -> int``.
_COMMAND_MODULES = (
    "agentlightning.cli._store",
    "agentlightning.cli._proxy",
    "agentlightning.cli._train",
    "agentlightning.cli._runner",
)


def build_parser() -> argparse.ArgumentParser:
    """The full ``agl`` argument parser."""
    from agentlightning import __version__

    parser = argparse.ArgumentParser(prog="agl", description="Agent Lightning command line")
    parser.add_argument("--version", action="version", version=f"agl (agentlightning-core) {__version__}")
    subparsers = parser.add_subparsers(dest="command", required=True)
    for module_name in _COMMAND_MODULES:
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name != module_name:
                raise
            continue
        module.register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``agl``; returns the process exit code (2 when a foreign ``agentlightning`` is installed)."""
    from agentlightning._distribution import foreign_message

    foreign = foreign_message()
    if foreign is not None:
        print(f"agl: error: {foreign}", file=sys.stderr)
        return 2
    parser = build_parser()
    args = parser.parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)
    owns_lifeline = getattr(args, "owns_lifeline", None)  # a command that watches its parent itself
    if owns_lifeline is None or not owns_lifeline(args):
        watch_parent()  # started by a trainer (`start_child`): end when it does, even after a kill -9
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
