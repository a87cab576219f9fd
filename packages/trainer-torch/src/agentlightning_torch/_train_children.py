"""``agl train``'s child processes: the dashboard's store server and the runners, watched while the run goes on,
stopped on every way out, and tied to ``agl train`` (`agentlightning.cli.start_child`) so that even a ``kill -9`` of
it ends them.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import secrets
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from agentlightning.cli import start_child

__all__ = ["RunnerDied", "guarded", "start_dashboard", "start_runners", "stop_children"]


class RunnerDied(Exception):
    """A runner process exited while the run waited for rollouts."""


def start_dashboard(db: Path, port: int) -> tuple[subprocess.Popen[bytes], str]:
    """``agl store serve`` of the run's file on loopback ``port``, with a new token; returns it and the URL to open.

    A token even on loopback: a web page in the user's browser can reach the port. It reaches the child in its
    environment (not on its command line, which ``ps`` shows) and the user in the URL's fragment (``#token=``).
    """
    token = secrets.token_urlsafe(32)
    dashboard = start_child(  # tied to this process: a kill -9 of agl train ends it too
        [sys.executable, "-m", "agentlightning.cli", "store", "serve", "--db", str(db), "--port", str(port)],
        env={**os.environ, "AGL_STORE_TOKEN": token},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    return dashboard, f"http://127.0.0.1:{port}/ui#token={token}"


def start_runners(args: argparse.Namespace, where: list[str], token: str | None) -> list[subprocess.Popen[bytes]]:
    """``--runners`` local runner processes reaching the store by ``where`` (``--db FILE`` or ``--store-url URL``)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "AGL_STORE_TOKEN": token or ""}
    # The runners import only the core and the user's agent (never torch): they start fast and stay small.
    # `agl runner` either way (token from the environment; a served store is reconnected to; drains on SIGTERM).
    cmd = [sys.executable, "-m", "agentlightning.cli", "runner", "--agent", args.agent, *where]
    cmd += ["--app-dir", str(Path(args.app_dir).resolve()), "--workers", str(args.workers)]
    if where[0] == "--db":
        cmd += ["--poll-interval", "0.02"]  # a local SQLite poll is cheap: pick up new rollouts sooner
    runners: list[subprocess.Popen[bytes]] = []
    try:
        for _ in range(args.runners):
            # own process group each; tied to this process, so that even a kill -9 of agl train ends them
            runners.append(start_child(cmd, env=env, start_new_session=True))
    except OSError:
        stop_children(runners)
        raise
    return runners


def stop_children(children: list[subprocess.Popen[bytes]], grace_s: float = 15.0) -> None:
    """Stop each child's whole process group (the child and anything it started): SIGTERM, then SIGKILL.

    The children run in their own sessions, so a Ctrl-C at the terminal reaches only ``agl train``, which then
    stops them here on its way out (every exit path calls this).
    """

    def signal_group(process: subprocess.Popen[bytes], sig: signal.Signals) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):  # already gone, its group with it
            os.killpg(process.pid, sig)

    for process in children:
        signal_group(process, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    for process in children:
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=max(deadline - time.monotonic(), 0.1))
    for process in children:  # the group may outlive its leader: kill what is left either way
        signal_group(process, signal.SIGKILL)
        process.wait()


async def guarded(runners: list[subprocess.Popen[bytes]], work: Any) -> Any:
    """Run ``work``, but stop at once with a clear error if a runner process dies (no silent zero-reward run)."""

    async def watch() -> None:
        while all(r.poll() is None for r in runners):
            await asyncio.sleep(0.5)
        dead = next(r for r in runners if r.poll() is not None)
        raise RunnerDied(f"a runner process exited with code {dead.returncode}; its error is printed above")

    watcher, job = asyncio.ensure_future(watch()), asyncio.ensure_future(work)
    try:
        done, _ = await asyncio.wait({watcher, job}, return_when=asyncio.FIRST_COMPLETED)
        if job not in done:
            job.cancel()
            await asyncio.gather(job, return_exceptions=True)
            watcher.result()
        return job.result()
    finally:
        # Cancelled too when the run is (Ctrl-C, SIGTERM): left running, it would see the runners stop on the way
        # out and raise into nowhere ("Task exception was never retrieved").
        for task in (watcher, job):
            task.cancel()
        await asyncio.gather(watcher, job, return_exceptions=True)
