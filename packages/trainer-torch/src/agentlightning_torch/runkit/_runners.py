"""A run's child processes: local runner processes (``agl runner`` with the script's agent) and the dashboard's store
server, each tied to the trainer (`agentlightning.cli.start_child`) so that even a ``kill -9`` of it ends them."""

from __future__ import annotations

import os
import secrets
import socket
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from agentlightning.cli import start_child
from agentlightning.cli import start_runners as start_runner_processes

__all__ = ["AgentRunners", "free_port", "start_dashboard"]


@dataclass(frozen=True)
class AgentRunners:
    """How local runner processes run the agent: ``agl runner --app-dir APP_DIR --agent AGENT [--instrument ...]``.

    The same command runs runners on other machines (against a served store: ``--store-url URL``), so a script
    needs no runner script of its own.

    Attributes:
        agent: The rollout function as ``module:function``.
        app_dir: The folder put first on the runners' ``sys.path`` to import it.
        instrument: Adapters to instrument (``langchain``, ``openai_agents``, ``autogen``; comma-separated);
            ``None``: every installed one.
        worker_mode: ``agl runner --worker-mode`` (``auto``: async tasks for an async agent).
        env: Extra environment of the runner processes.
    """

    agent: str
    app_dir: Path
    instrument: str | None = None
    worker_mode: str = "auto"
    env: Mapping[str, str] = field(default_factory=dict[str, str])

    def command(self, where: list[str], workers: int, processes: int = 1) -> list[str]:
        """The runners' command; ``where`` is ``--db FILE`` or ``--store-url URL``.

        ``processes`` > 1: one ``agl runner --processes N`` that imports the agent once and forks the N runner
        processes, which share ``workers``.
        """
        cmd = [sys.executable, "-m", "agentlightning.cli", "runner", "--app-dir", str(Path(self.app_dir).resolve())]
        cmd += ["--agent", self.agent, "--worker-mode", self.worker_mode, *where, "--workers", str(workers)]
        if processes > 1:
            cmd += ["--processes", str(processes)]
        if self.instrument is not None:
            cmd += ["--instrument", self.instrument]
        if where[:1] == ["--db"]:
            cmd += ["--poll-interval", "0.02"]  # a local SQLite poll is cheap: pick up new rollouts sooner
        return cmd

    def start(
        self, where: list[str], workers: int, processes: int, token: str | None = None
    ) -> list[subprocess.Popen[bytes]]:
        """``processes`` runner processes sharing ``workers`` concurrent rollouts (each at least one).

        They import only the core and the agent (never torch): they start fast and stay small. Several are forked
        from one process that imported the agent once (``agl runner --processes``), which supervises them and is
        the one process returned: it exits when one of them fails, and a signal to it reaches each of them once.
        """
        env = {**os.environ, **self.env, "OMP_NUM_THREADS": "1", "AGL_STORE_TOKEN": token or ""}
        return start_runner_processes([self.command(where, max(workers, processes), processes)], env)


def free_port(preferred: int) -> int:
    """``preferred`` when it is free on 127.0.0.1, else any free port."""
    for port in (preferred, 0):
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            return int(sock.getsockname()[1])
    raise OSError("no free port on 127.0.0.1")


def start_dashboard(db: Path, port: int) -> tuple[subprocess.Popen[bytes], str]:
    """``agl store serve`` of the run's file on loopback ``port``, with a new token; returns it and the URL to open.

    A token even on loopback: a web page in the user's browser can reach the port. It reaches the child in its
    environment (not on its command line, which ``ps`` shows) and the user in the URL's fragment (``#token=``).
    """
    token = secrets.token_urlsafe(32)
    dashboard = start_child(  # tied to this process: a kill -9 of the trainer ends it too
        [sys.executable, "-m", "agentlightning.cli", "store", "serve", "--db", str(db), "--port", str(port)],
        env={**os.environ, "AGL_STORE_TOKEN": token},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    return dashboard, f"http://127.0.0.1:{port}/ui#token={token}"
