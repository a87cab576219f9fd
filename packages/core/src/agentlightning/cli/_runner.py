"""``agl runner``: run an agent on a store's rollouts, on this machine or any other that reaches the store.

    agl runner --store-url http://trainer:4747 --token "$AGL_STORE_TOKEN" --agent my_pkg.agent:solve --workers 64

It keeps running across store outages (a trainer restarting: it backs off and reconnects) and drains on SIGTERM or
Ctrl-C: no new claims, running rollouts get ``--drain-timeout`` seconds, the rest are released to the store at once
so other runners take them. A second signal releases at once.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys
from typing import Any

from agentlightning._eventloop import run_async
from agentlightning.cli._options import (
    add_agent_command_arguments,
    add_log_level_argument,
    command_agent,
    error_console,
)
from agentlightning.cli._store import add_store_arguments, connect_store, store_location

__all__ = ["register", "run"]

logger = logging.getLogger(__name__)


def register(subparsers: Any) -> None:
    """Add ``agl runner`` to the ``agl`` parser."""
    parser = subparsers.add_parser(
        "runner",
        help="run an agent on the store's rollouts (any machine)",
        description=(
            "Take rollouts from a store (served by `agl store serve` or a trainer's --serve-store, or a local SQLite "
            "file), run the agent on each and report spans and rewards. Drains on SIGTERM."
        ),
    )
    add_store_arguments(parser, "--token")
    which = parser.add_mutually_exclusive_group(required=True)
    which.add_argument("--agent", help="the agent function as module:function (e.g. my_pkg.agent:solve)")
    add_agent_command_arguments(which, parser)
    parser.add_argument(
        "--app-dir",
        default=".",
        help="folder put first on sys.path to import --agent, or --agent-command's (default: .)",
    )
    parser.add_argument(
        "--workers", type=int, default=8, help="concurrent rollouts, of all --processes together (default: 8)"
    )
    parser.add_argument(
        "--processes",
        type=int,
        default=1,
        help="runner processes, forked after the agent and its adapters are imported (imported once, not once per "
        "process), sharing --workers; this process supervises them (default: 1: this process runs the rollouts)",
    )
    parser.add_argument(
        "--worker-mode",
        choices=("auto", "async", "thread", "process"),
        default="auto",
        help="async tasks, threads or processes (default: auto = async for async agents)",
    )
    tracing = parser.add_mutually_exclusive_group()
    tracing.add_argument(
        "--instrument",
        default=None,
        help="comma-separated adapters to instrument, e.g. langchain (default: every installed framework adapter)",
    )
    tracing.add_argument("--no-instrument", action="store_true", help="instrument no adapter (the agent traces itself)")
    parser.add_argument(
        "--drain-timeout",
        type=float,
        default=0.0,
        help="on SIGTERM, seconds running rollouts may finish before they are released (default: 0, release at once)",
    )
    parser.add_argument("--heartbeat-interval", type=float, default=5.0, help="seconds between heartbeats")
    parser.add_argument(
        "--rollout-timeout",
        type=float,
        default=None,
        help="seconds an attempt may run before it ends as timeout; a worker whose agent blocks it (its event loop, "
        "or the GIL) that long is killed and replaced, see the runner's watchdog (default: no limit)",
    )
    parser.add_argument(
        "--poll-interval",
        type=float,
        default=0.05,
        help="seconds between polls of an empty queue (under 0.1: doubled with each empty answer, up to 0.1)",
    )
    add_log_level_argument(parser)
    parser.set_defaults(func=run, owns_lifeline=owns_lifeline)


def run(args: argparse.Namespace) -> int:
    """Run until drained by a signal; returns the exit code (2 for a refused configuration)."""
    import agentlightning as agl
    from agentlightning.adapters import get_adapter

    console = error_console()  # rich where the serving extra is installed, plain lines without it
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    for flag, value in (("--workers", args.workers), ("--processes", args.processes)):
        if value < 1:
            console.print(f"[red]{flag} must be at least 1, got {value}[/red]")
            return 2
    if args.drain_timeout < 0:
        console.print(f"[red]--drain-timeout must not be negative, got {args.drain_timeout}[/red]")
        return 2
    try:
        if args.agent_command is not None:
            agent = command_agent(args)  # a program per rollout: nothing of it runs in this process to instrument
        else:
            agent = agl.load_agent(args.agent, args.app_dir)
            # A framework that traces only through the global OpenTelemetry provider (AutoGen) is routed into
            # rollouts when the first one starts (`agentlightning.tracing.when_global_provider`), as under any runner.
            if args.instrument:
                names = [name.strip() for name in args.instrument.split(",") if name.strip()]
                for name in names:
                    get_adapter(name).instrument()  # a missing or unsupported framework is an error here
            elif not args.no_instrument:
                agl.instrument_all()
    except (ValueError, OSError, KeyError, ImportError, agl.StoreError) as exc:
        console.print(f"[red]{exc}[/red]")
        return 2
    if args.processes == 1:
        return _serve(args, agent, args.workers, console)
    return _supervise(args, agent, console)


def _supervise(args: argparse.Namespace, agent: Any, console: Any) -> int:
    """``--processes`` runner processes sharing ``--workers``, supervised by this one."""
    from agentlightning._lifeline import take_lifeline
    from agentlightning.cli._fork import supervise_runners

    def fresh_command(workers: int, index: int) -> list[str]:  # the same runner, alone: the last options win
        cmd = [sys.executable, "-m", "agentlightning.cli", *args.argv, "--workers", str(workers), "--processes", "1"]
        return cmd + ([] if args.store_url is None else ["--store-url", spread_urls(args.store_url, index)])

    return supervise_runners(
        args.processes,
        args.workers,
        lambda workers, index: _serve(args, agent, workers, console, index),
        fresh_command,
        take_lifeline(),
    )


def owns_lifeline(args: argparse.Namespace) -> bool:
    """Whether this ``agl runner`` watches its parent itself (``--processes`` > 1: its supervisor polls the lifeline;
    a watching thread would make forking unsafe)."""
    return args.processes > 1


def spread_urls(store_url: str, index: int) -> str:
    """``--store-url`` of runner ``index`` of several: the servers of ``store_url`` (comma-separated) rotated by
    ``index``, so that the runners prefer different servers and each fails over to the others in turn."""
    urls = [url for url in store_url.split(",") if url.strip()]
    if not urls:
        return store_url
    shift = index % len(urls)
    return ",".join(urls[shift:] + urls[:shift])


def _serve(args: argparse.Namespace, agent: Any, workers: int, console: Any, index: int = 0) -> int:
    """One runner process (number ``index`` of ``--processes``) with ``workers`` concurrent rollouts, until drained."""
    import agentlightning as agl

    store_url = None if args.store_url is None else spread_urls(args.store_url, index)
    try:
        store = connect_store(store_url, args.db, args.token)
        runner = agl.Runner(
            agent,
            store=store,
            n_workers=workers,
            worker_mode=args.worker_mode,
            heartbeat_interval=args.heartbeat_interval,
            poll_interval=args.poll_interval,
            rollout_timeout=args.rollout_timeout,
        )
    except (ValueError, OSError, KeyError, ImportError, agl.StoreError) as exc:
        console.print(f"[red]{exc}[/red]")
        return 2
    signals = {"count": 0}

    def on_signal(signum: int, frame: Any) -> None:
        signals["count"] += 1
        first = signals["count"] == 1
        grace = args.drain_timeout if first else 0.0
        # A stop someone asked for is no warning (a trainer stops its runners this way every run); a second one is.
        logger.log(
            logging.INFO if first else logging.WARNING,
            "%s: draining (running rollouts released after %.0f s)",
            signal.Signals(signum).name,
            grace,
        )
        runner.drain(grace)

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    where = store_location(store_url, args.db)
    what = args.agent or repr(args.agent_command)
    console.print(
        f"runner: {workers} {runner.worker_mode} worker(s) running {what} on rollouts from {where} (pid {os.getpid()})"
    )
    if runner.worker_mode == "async":
        run_async(_run_async(runner, store))  # one loop for the workers and the store's connections
    else:
        runner.run()
        asyncio.run(store.close())
    return 0


async def _run_async(runner: Any, store: Any) -> None:
    try:
        await runner.arun()
    finally:
        await store.close()
