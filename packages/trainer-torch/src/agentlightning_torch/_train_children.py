"""``agl train``'s child processes: the dashboard's store server and the runners, watched while the run goes on,
stopped on every way out, and tied to ``agl train`` (`agentlightning.cli.start_child`) so that even a ``kill -9`` of
it ends them.
"""

from __future__ import annotations

import argparse
import os
import secrets
import subprocess
import sys
from pathlib import Path

from agentlightning.cli import RunnerDied, guarded, start_child, stop_children
from agentlightning.cli import start_runners as start_runners_of

__all__ = ["RunnerDied", "guarded", "start_dashboard", "start_runners", "stop_children"]


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
    # own session each; tied to this process, so that even a kill -9 of agl train ends them
    return start_runners_of([cmd] * args.runners, env)
