"""`ServedStoreProcess`: a real ``agl store serve`` process on loopback, for tests that need a served store."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from types import TracebackType

from agentlightning._netauth import new_token
from agentlightning.store._base import RetryPolicy
from agentlightning.store._postgres_schema import is_postgres_dsn

__all__ = ["ServedStoreProcess", "free_port"]

_LAUNCH = "import sys; from agentlightning.cli import main; sys.exit(main())"


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class ServedStoreProcess:
    """Runs ``agl store serve`` in a child process and waits until ``/healthz`` answers.

    Args:
        db: SQLite file to serve, or a ``postgresql://`` DSN (kept as given); ``None`` serves an in-memory store.
        token: Bearer token the server requires (``None``: a new one, `token`); passed in the environment.
        retry_policy: Passed as ``--max-attempts`` / ``--heartbeat-timeout`` / ``--rollout-timeout`` / ``--retry-on``.
        port: Port to bind (default: a free one, kept across `restart`).
        extra_args: More ``agl store serve`` arguments.
    """

    def __init__(
        self,
        db: Path | str | None = None,
        token: str | None = None,
        retry_policy: RetryPolicy | None = None,
        port: int | None = None,
        extra_args: list[str] | None = None,
    ) -> None:
        self.db: Path | str | None = None
        if db is not None:
            self.db = str(db) if is_postgres_dsn(str(db)) else Path(db)
        self.token: str = token or new_token()
        self.retry_policy = retry_policy
        self.port = port or free_port()
        self.extra_args = list(extra_args or [])
        self.proc: subprocess.Popen[bytes] | None = None
        # A file, not a pipe: a chatty server must never block on a full pipe nobody reads.
        self._log = tempfile.TemporaryFile()  # noqa: SIM115 - lives as long as this object; closed in __exit__

    def output(self) -> str:
        """Everything the server printed so far (all runs)."""
        self._log.seek(0)
        return self._log.read().decode(errors="replace")

    @property
    def url(self) -> str:
        """Base URL of the server."""
        return f"http://127.0.0.1:{self.port}"

    def command(self) -> list[str]:
        """The command line that starts the server."""
        args = [sys.executable, "-c", _LAUNCH, "store", "serve", "--host", "127.0.0.1", "--port", str(self.port)]
        args += ["--memory"] if self.db is None else ["--db", str(self.db)]
        policy = self.retry_policy
        if policy is not None:
            args += ["--max-attempts", str(policy.max_attempts), "--heartbeat-timeout", repr(policy.heartbeat_timeout)]
            args += ["--retry-on", ",".join(sorted(policy.retry_on)) or ","]
            if policy.rollout_timeout is not None:
                args += ["--rollout-timeout", repr(policy.rollout_timeout)]
        return args + self.extra_args

    def start(self, timeout: float = 60.0) -> ServedStoreProcess:
        """Start the process and block until it answers ``/healthz``; raises `RuntimeError` if it dies first."""
        env = {**os.environ, "AGL_STORE_TOKEN": self.token}  # not on the command line: `ps` shows that
        self.proc = subprocess.Popen(self.command(), env=env, stdout=self._log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"store server exited with {self.proc.returncode}: {self.output()}")
            try:
                with urllib.request.urlopen(f"{self.url}/healthz", timeout=1.0) as resp:
                    if resp.status == 200:
                        return self
            except (urllib.error.URLError, OSError):
                time.sleep(0.05)
        self.kill()
        raise RuntimeError(f"store server did not answer /healthz within {timeout} s")

    def stop(self, timeout: float = 15.0) -> int | None:
        """Graceful stop (SIGTERM, like Ctrl-C); returns the exit code."""
        if self.proc is None:
            return None
        proc, self.proc = self.proc, None
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        return proc.returncode

    def kill(self) -> None:
        """Hard stop (SIGKILL): the server gets no chance to flush anything."""
        if self.proc is None:
            return
        proc, self.proc = self.proc, None
        proc.kill()
        proc.wait()

    def restart(self, hard: bool = False) -> ServedStoreProcess:
        """Stop (``hard``: SIGKILL) and start again on the same port and file."""
        if hard:
            self.kill()
        else:
            self.stop()
        return self.start()

    def __enter__(self) -> ServedStoreProcess:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
        self._log.close()
