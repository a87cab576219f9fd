"""The ``agl`` command line: ``agl store serve``, ``agl proxy serve``, ``agl runner``, ``agl train``.

Each command group lives in its own module and registers its sub-parsers through ``register(subparsers)``. Other
packages add commands without the core naming them: each entry point of the `COMMAND_ENTRY_POINTS` group
(``agentlightning.commands``) is such a ``register`` callable (a trainer package registers ``agl model`` there),
loaded only when its command runs: a package that does not load fails that command in one line, never ``agl``.
A program that starts ``agl`` commands as its helpers (a trainer's runners and store server) starts them with
`start_child` (runners: `start_runners`, awaited through `guarded`, stopped by `stop_children`), so that they end
when it does, whatever ends it. ``agl train`` trains with an `EnginePlugin` that an engine package registers (the
`agentlightning.loop.ENGINE_ENTRY_POINTS` group, found by `load_engine`).
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence
from importlib.metadata import entry_points
from typing import Any

from agentlightning._lifeline import start_child, watch_parent
from agentlightning._runner_pool import RunnerDied, cancel_on_sigterm, guarded, start_runners, stop_children
from agentlightning.cli._doctor import DoctorRound
from agentlightning.cli._engines import EngineNotFoundError, EnginePlugin, engine_names, load_engine
from agentlightning.cli._judge import add_judge_arguments, judge_config
from agentlightning.cli._options import command_agent
from agentlightning.cli._spec import (
    JUDGE_FIELDS,
    NETWORK_FIELDS,
    RUNNER_FIELDS,
    Cli,
    EngineCapabilities,
    EngineRefusal,
    RunSpec,
    add_spec_arguments,
    option_flag,
    refuse_unhonoured,
)
from agentlightning.cli._tasks import TaskFileError, read_task_file
from agentlightning.cli._train import add_network_arguments, add_runner_arguments, parse_train_spec, train_parser

__all__ = [
    "COMMAND_ENTRY_POINTS",
    "JUDGE_FIELDS",
    "NETWORK_FIELDS",
    "RUNNER_FIELDS",
    "Cli",
    "DoctorRound",
    "EngineCapabilities",
    "EngineNotFoundError",
    "EnginePlugin",
    "EngineRefusal",
    "RunSpec",
    "RunnerDied",
    "TaskFileError",
    "add_judge_arguments",
    "add_network_arguments",
    "add_runner_arguments",
    "add_spec_arguments",
    "build_parser",
    "cancel_on_sigterm",
    "command_agent",
    "engine_names",
    "guarded",
    "judge_config",
    "load_engine",
    "main",
    "option_flag",
    "parse_train_spec",
    "read_task_file",
    "refuse_unhonoured",
    "start_child",
    "start_runners",
    "stop_children",
    "train_parser",
]

# Command modules, each exposing ``register(subparsers)``; a sub-parser sets ``func(args) -> int``.
_COMMAND_MODULES = (
    "agentlightning.cli._store",
    "agentlightning.cli._proxy",
    "agentlightning.cli._train",
    "agentlightning.cli._runner",
    "agentlightning.cli._judge",
    "agentlightning.cli._doctor",
)

COMMAND_ENTRY_POINTS = "agentlightning.commands"
"""Entry-point group of ``agl`` commands from other packages: ``name = "pkg.module:register"``, where
``register(subparsers)`` adds the sub-parser ``name`` (and sets its ``func(args) -> int``)."""


def _register_plugins(subparsers: Any) -> None:
    """List the installed packages' `COMMAND_ENTRY_POINTS` commands, in name order; built-in names win.

    Each is a stand-in that takes the rest of the command line as it is: the package (which may import torch) is
    loaded only when its command runs, so ``agl --help`` and the core's own commands stay as fast as without it.
    """
    for entry in sorted(entry_points(group=COMMAND_ENTRY_POINTS), key=lambda ep: ep.name):
        if entry.name in subparsers.choices:
            continue  # a package cannot shadow a core command (or one installed twice register twice)
        source = entry.dist.name if entry.dist is not None else entry.value
        # no "-" prefix: every word after the command, options and --help included, goes to the real parser
        stand_in = subparsers.add_parser(
            entry.name, help=f"(from {source}: agl {entry.name} --help)", add_help=False, prefix_chars="\0"
        )
        stand_in.add_argument("plugin_args", nargs=argparse.REMAINDER)
        stand_in.set_defaults(func=_plugin_command(entry.name, entry.value, entry.load, source))


def _plugin_command(name: str, target: str, load: Any, source: str) -> Any:
    """``func(args)`` of a stand-in: load ``register``, parse the command line with it, run what it set."""

    def run(args: argparse.Namespace) -> int:
        try:
            register: Any = load()
        except Exception as error:  # a broken package must fail as one line, not a traceback
            reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
            print(f"error: agl {name}: {target} (from {source}) does not load: {reason}", file=sys.stderr)
            return 2
        parser = argparse.ArgumentParser(prog="agl")
        register(parser.add_subparsers(dest="command", required=True))
        real = parser.parse_args([name, *args.plugin_args])
        real.argv = args.argv
        return int(real.func(real) or 0)

    return run


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
    _register_plugins(subparsers)
    return parser


def _serving_refusal(args: argparse.Namespace) -> str | None:
    """The install line for a command that serves (``serving`` set) when the ``serve`` extra is not installed."""
    from agentlightning._serve_extra import missing_serve_modules, serve_hint

    serving: str | None = getattr(args, "serving", None)
    if serving is None:
        return None
    missing = missing_serve_modules()
    return serve_hint(serving, missing) if missing else None


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
    refusal = _serving_refusal(args)
    if refusal is not None:
        print(f"agl: error: {refusal}", file=sys.stderr)
        return 2
    owns_lifeline = getattr(args, "owns_lifeline", None)  # a command that watches its parent itself
    if owns_lifeline is None or not owns_lifeline(args):
        watch_parent()  # started by a trainer (`start_child`): end when it does, even after a kill -9
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
