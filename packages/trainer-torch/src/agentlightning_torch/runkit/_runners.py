"""A run's child processes: local runner processes (``agl runner`` with the script's agent) and the dashboard's store
server, each tied to the trainer (`agentlightning.cli.start_child`) so that even a ``kill -9`` of it ends them."""

from __future__ import annotations

import asyncio
import logging
import os
import secrets
import socket
import subprocess
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from agentlightning.cli import start_child
from agentlightning.cli import start_runners as start_runner_processes

__all__ = ["AgentRunners", "OnDemandDashboard", "free_port", "start_dashboard"]

logger = logging.getLogger(__name__)


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
        agent_command: Run this program per rollout instead of ``agent`` (``agl runner --agent-command``).
        agent_timeout: With ``agent_command``: seconds a rollout's command may run (``None``: no limit).
        rollout_timeout: ``agl runner --rollout-timeout``: seconds an attempt may run (a worker whose agent blocks
            it that long is replaced); ``None``: the run sets it a little under its iterations' wait.
    """

    agent: str
    app_dir: Path
    instrument: str | None = None
    worker_mode: str = "auto"
    env: Mapping[str, str] = field(default_factory=dict[str, str])
    agent_command: str | None = None
    agent_timeout: float | None = None
    rollout_timeout: float | None = None

    def command(self, where: list[str], workers: int, processes: int = 1) -> list[str]:
        """The runners' command; ``where`` is ``--db FILE`` or ``--store-url URL``.

        ``processes`` > 1: one ``agl runner --processes N`` that imports the agent once and forks the N runner
        processes, which share ``workers``.
        """
        cmd = [sys.executable, "-m", "agentlightning.cli", "runner", "--app-dir", str(Path(self.app_dir).resolve())]
        if self.agent_command is not None:
            cmd += ["--agent-command", self.agent_command]
            cmd += [] if self.agent_timeout is None else ["--agent-timeout", str(self.agent_timeout)]
        else:
            cmd += ["--agent", self.agent]
        cmd += ["--worker-mode", self.worker_mode, *where, "--workers", str(workers)]
        if processes > 1:
            cmd += ["--processes", str(processes)]
        if self.instrument is not None:
            cmd += ["--instrument", self.instrument]
        if self.rollout_timeout is not None:
            cmd += ["--rollout-timeout", repr(self.rollout_timeout)]
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


class OnDemandDashboard:
    """The dashboard's store server (``agl store serve`` of the run's file), started when its address is first visited.

    The port is bound here at once, so the address printed works from the start; the first connection waits in the
    socket's backlog while the server starts (about a second), and the server then serves that socket itself
    (``--fd``). A run nobody looks at never pays the server's start (~0.8 s of CPU, its imports) nor its memory.
    Create it on the run's event loop; `close` it when the run ends. The server, once started, is handed to
    ``on_start`` (tied to this process by `start_child`: stop it with `stop_children`).

    Args:
        db: The run's SQLite file.
        port: The loopback port (0: any free one).
        on_start: Gets the server's process once it is started.

    Attributes:
        url: The dashboard's address with its token in the fragment (``#token=``), as `start_dashboard` gives.
        process: The server, once started (``None`` before).
    """

    def __init__(self, db: Path, port: int, on_start: Callable[[subprocess.Popen[bytes]], None]) -> None:
        self._db = db
        self._on_start = on_start
        self._token = secrets.token_urlsafe(32)  # see start_dashboard: a token even on loopback
        self._sock: socket.socket | None = socket.create_server(("127.0.0.1", port))
        self._loop = asyncio.get_running_loop()
        self._loop.add_reader(self._sock.fileno(), self._start)
        self.url = f"http://127.0.0.1:{self._sock.getsockname()[1]}/ui#token={self._token}"
        self.process: subprocess.Popen[bytes] | None = None

    def _start(self) -> None:
        sock = self._release()
        if sock is None:
            return
        try:
            fd = sock.fileno()
            cmd = [sys.executable, "-m", "agentlightning.cli", "store", "serve", "--db", str(self._db), "--fd", str(fd)]
            self.process = start_child(
                cmd,
                env={**os.environ, "AGL_STORE_TOKEN": self._token},
                pass_fds=(fd,),
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,
            )
        except OSError as exc:
            logger.warning("could not start the dashboard's store server: %s", exc)
            return
        finally:
            sock.close()  # the server has its own copy: the waiting connection stays in the backlog for it
        self._on_start(self.process)

    def _release(self) -> socket.socket | None:
        sock, self._sock = self._sock, None
        if sock is not None:
            self._loop.remove_reader(sock.fileno())
        return sock

    def close(self) -> None:
        """Stop listening if the server never started (a started server is stopped with the run's children)."""
        sock = self._release()
        if sock is not None:
            sock.close()
