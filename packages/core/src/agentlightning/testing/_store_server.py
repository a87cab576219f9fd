"""`StoreServerProcessForTests`: `agentlightning.StoreServerProcess` on loopback, with what tests add to it."""

from __future__ import annotations

import os
import shutil
import socket
import tempfile
import weakref
from pathlib import Path
from typing import Self

from agentlightning.store import RetryPolicy, StoreServerProcess

__all__ = ["StoreServerProcessForTests", "free_port"]


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class StoreServerProcessForTests(StoreServerProcess):
    """A trainer's store server (`agentlightning.StoreServerProcess`: the same ``agl store serve`` child, started,
    health-checked and stopped the same way) on ``127.0.0.1``, with what tests add:

    * a free port when none is given, kept across `restart`;
    * a fresh SQLite file of its own when no ``db`` is given;
    * the server's output, every run's, kept in a file (`output`) and quoted when the server fails to start;
    * `kill` (SIGKILL: the machine goes down, nothing is flushed) and `restart` on the same port and file.

    Its own files (the output, the fresh SQLite file) live in `folder`, removed when the object is garbage-collected.

    Args:
        db: SQLite file to serve, or a ``postgresql://`` DSN (kept as given); ``None``: a fresh SQLite file.
        token: Bearer token the server requires (``None``: a new one, `token`); passed in the environment.
        retry_policy: The served store's retry policy (``None``: the default).
        port: Port to bind (``None``: a free one).
        extra_args: More ``agl store serve`` arguments (``["--no-ui"]``).
    """

    def __init__(
        self,
        db: str | os.PathLike[str] | None = None,
        token: str | None = None,
        retry_policy: RetryPolicy | None = None,
        port: int | None = None,
        extra_args: list[str] | None = None,
    ) -> None:
        self.folder = Path(tempfile.mkdtemp(prefix="agl-store-server-"))
        weakref.finalize(self, shutil.rmtree, self.folder, ignore_errors=True)
        super().__init__(
            self.folder / "store.db" if db is None else db,
            "127.0.0.1",
            port or free_port(),
            token=token,
            retry_policy=retry_policy,
            log_file=self.folder / "server.log",  # a file, not a pipe: a chatty server never blocks on a full pipe
        )
        self.extra_args = list(extra_args or [])

    def command(self) -> list[str]:
        """The child's command line (without the token), `extra_args` included."""
        return super().command() + self.extra_args

    def output(self) -> str:
        """Everything the server printed so far (every run's)."""
        log = self.folder / "server.log"
        return log.read_text(errors="replace") if log.exists() else ""

    def start(self, timeout: float = 60.0) -> Self:
        """Start the server and wait until it answers ``/healthz`` (`StoreServerProcess.start`).

        Raises:
            RuntimeError: The server exits first or does not answer in time; the message quotes its output.
        """
        try:
            return super().start(timeout)
        except RuntimeError as exc:
            raise RuntimeError(f"{exc}; the server's output:\n{self.output()}") from exc

    def kill(self) -> None:
        """Hard stop (SIGKILL, as when the machine goes down): the server gets no chance to answer or flush."""
        proc = self._proc
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait()
        self.stop()  # the process is gone: this only forgets it and closes the output file

    def restart(self, hard: bool = False) -> Self:
        """Stop (``hard``: `kill`) and start again on the same port and file."""
        if hard:
            self.kill()
        else:
            self.stop()
        return self.start()
