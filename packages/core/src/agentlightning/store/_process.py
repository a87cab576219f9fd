"""`StoreServerProcess`: a trainer's store (a SQLite file or a PostgreSQL database) served to other machines by an
``agl store serve`` child process.

A separate process, not a thread of the trainer: the trainer's own work (a PPO step holds the GIL for seconds)
never delays the runners' requests, and SQLite lets both processes use the file at once.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from types import TracebackType
from typing import IO, Self

from agentlightning._lifeline import start_child
from agentlightning._netauth import check_bind_token, is_wildcard, new_token
from agentlightning._serve_extra import require_serve
from agentlightning.store._base import RetryPolicy
from agentlightning.store._postgres_schema import is_postgres_dsn, mask_password

__all__ = ["StoreServerProcess"]

logger = logging.getLogger(__name__)


class StoreServerProcess:
    """Serve a store over HTTP from a child process (``agl store serve``) until `stop`.

    Args:
        db: The SQLite file, or a ``postgresql://`` DSN (kept as given); the trainer keeps using it directly.
        host: Interface to bind (``0.0.0.0``: every interface).
        port: Port to bind.
        token: Bearer token clients must send; required, at least 16 characters, off loopback; ``None`` on
            loopback: a new one (`token`). It reaches the child through its environment, never its command line.
        retry_policy: The served store's retry policy (heartbeat timeout, attempts); ``None``: the default.
        access_log: Log every request with the client's address (``uvicorn.access`` lines) to ``log_file``.
        log_file: Where the server's output goes (default: inherited stderr).
    """

    def __init__(
        self,
        db: str | os.PathLike[str],
        host: str,
        port: int,
        *,
        token: str | None = None,
        retry_policy: RetryPolicy | None = None,
        access_log: bool = False,
        log_file: str | os.PathLike[str] | None = None,
    ) -> None:
        check_bind_token(host, token, "the store", "a store token")
        self.db: Path | str = str(db) if is_postgres_dsn(str(db)) else Path(db)
        self.host = host
        self.port = port
        self.token: str = token or new_token()  # always one: a web page in a local browser can reach the port
        self.retry_policy = retry_policy
        self.access_log = access_log
        self.log_file = None if log_file is None else Path(log_file)
        self._proc: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None

    @property
    def url(self) -> str:
        """Where this machine reaches the server (``127.0.0.1`` when it binds every interface)."""
        host = "127.0.0.1" if is_wildcard(self.host) else self.host
        return f"http://[{host}]:{self.port}" if ":" in host else f"http://{host}:{self.port}"

    @property
    def pid(self) -> int | None:
        """The server process's id while it runs (``None`` before `start` and after `stop`)."""
        return None if self._proc is None else self._proc.pid

    def command(self) -> list[str]:
        """The child's command line (without the token)."""
        cmd = [sys.executable, "-m", "agentlightning.cli", "store", "serve", "--db", str(self.db)]
        cmd += ["--host", self.host, "--port", str(self.port)]
        policy = self.retry_policy
        if policy is not None:
            cmd += ["--max-attempts", str(policy.max_attempts), "--heartbeat-timeout", repr(policy.heartbeat_timeout)]
            cmd += ["--retry-on", ",".join(sorted(policy.retry_on)) or ","]
            if policy.rollout_timeout is not None:
                cmd += ["--rollout-timeout", repr(policy.rollout_timeout)]
        if self.access_log:
            cmd += ["--access-log"]
        return cmd

    def start(self, timeout: float = 60.0) -> Self:
        """Start the child and wait until it answers ``/healthz``.

        Raises:
            RuntimeError: If the child exits first (its output says why) or does not answer in ``timeout`` s.
            ImportError: The core's ``serve`` extra is not installed (the message is the install command).
        """
        if self._proc is not None:
            return self
        require_serve("StoreServerProcess (agl store serve)")  # here, not as a dead child's log line
        env = {**os.environ, "AGL_STORE_TOKEN": self.token}
        if self.log_file is not None:
            self._log = self.log_file.open("ab")
        # tied to this process: a trainer killed with kill -9 does not leave its store served
        self._proc = start_child(self.command(), env=env, stdout=self._log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout
        while True:
            code = self._proc.poll()
            if code is not None:
                self.stop()  # forgets the child and closes its log file
                where = f"; see {self.log_file}" if self.log_file is not None else ""
                raise RuntimeError(f"`agl store serve` on {self.host}:{self.port} exited with code {code}{where}")
            try:
                with urllib.request.urlopen(f"{self.url}/healthz", timeout=1.0) as resp:
                    if resp.status == 200:
                        break
            except (urllib.error.URLError, OSError):
                if time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError(f"the store server did not answer on {self.url} within {timeout} s") from None
                time.sleep(0.05)
        logger.info("serving store %s at http://%s:%d", mask_password(str(self.db)), self.host, self.port)
        return self

    def stop(self, timeout: float = 15.0) -> None:
        """Stop the child (SIGTERM, then SIGKILL after ``timeout`` seconds)."""
        proc, self._proc = self._proc, None
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if self._log is not None:
            self._log.close()
            self._log = None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
