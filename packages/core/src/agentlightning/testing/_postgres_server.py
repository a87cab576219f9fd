"""`PostgresServer`: a throwaway PostgreSQL server (``initdb`` + ``pg_ctl``) for tests and benchmarks.

The server lives in a temporary folder, listens on a free loopback port (and a unix socket in that folder), trusts
local connections, and is stopped and deleted by `stop`. PostgreSQL refuses to run as root: under root the
programs run as the ``postgres`` system user (Debian's package creates it), which then owns the folder.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import uuid
from pathlib import Path
from types import TracebackType

__all__ = ["PostgresServer", "find_pg_bin"]

_USER = "agl"


def find_pg_bin() -> Path | None:
    """The folder holding ``initdb`` and ``pg_ctl``: on PATH, else Debian's ``/usr/lib/postgresql/N/bin``."""
    found = shutil.which("initdb")
    if found is not None and shutil.which("pg_ctl") is not None:
        return Path(found).resolve().parent
    versions = sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"), key=lambda p: p.parent.parent.name)
    return versions[-1].parent if versions else None


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class PostgresServer:
    """A PostgreSQL server in a temporary folder, for one test session or benchmark.

    Args:
        settings: Extra server settings (``-c name=value``), e.g. ``{"fsync": "off"}`` for scratch data.

    Attributes:
        port: The loopback port it listens on.
        dsn: ``postgresql://agl@127.0.0.1:PORT/postgres`` (trust authentication: no password).
    """

    def __init__(self, settings: dict[str, str] | None = None) -> None:
        self.settings = dict(settings or {})
        self.port = 0
        self.dsn = ""
        self._folder: Path | None = None
        self._run_as: str | None = None

    @property
    def data_dir(self) -> Path:
        """The cluster's data folder (valid once started)."""
        assert self._folder is not None, "the server is not started"
        return self._folder / "data"

    def _command(self, *args: str) -> list[str]:
        if self._run_as is None:
            return list(args)
        return ["runuser", "-u", self._run_as, "--", *args]

    def start(self) -> PostgresServer:
        """``initdb`` a fresh cluster and start it; raises `RuntimeError` saying what is missing or failed."""
        bin_dir = find_pg_bin()
        if bin_dir is None:
            raise RuntimeError(
                "PostgreSQL's server programs (initdb, pg_ctl) are not installed: apt-get install postgresql"
            )
        self._folder = Path(tempfile.mkdtemp(prefix="agl-postgres-"))
        if os.geteuid() == 0:
            try:
                user = pwd.getpwnam("postgres")
            except KeyError:
                raise RuntimeError("PostgreSQL cannot run as root and there is no 'postgres' user to run it") from None
            os.chown(self._folder, user.pw_uid, user.pw_gid)
            self._run_as = "postgres"
        self.port = _free_port()
        options = " ".join(f"-c {name}={value}" for name, value in self.settings.items())
        try:
            self._check(bin_dir / "initdb", "-D", str(self.data_dir), "-U", _USER, "--auth=trust", "-E", "UTF8",
                        "--locale=C", "--no-sync")  # fmt: skip
            self._check(
                bin_dir / "pg_ctl", "-D", str(self.data_dir), "-l", str(self._folder / "server.log"), "-w", "-t", "60",
                "-o", f"-c listen_addresses=127.0.0.1 -p {self.port} -c unix_socket_directories={self._folder} "
                f"-c max_connections=200 {options}", "start",
            )  # fmt: skip
        except BaseException:
            self.stop()
            raise
        self.dsn = f"postgresql://{_USER}@127.0.0.1:{self.port}/postgres"
        return self

    def _check(self, *args: str | Path) -> None:
        done = subprocess.run(self._command(*map(str, args)), capture_output=True, text=True, timeout=120)
        if done.returncode != 0:
            log = ""
            if self._folder is not None and (self._folder / "server.log").exists():
                log = (self._folder / "server.log").read_text(errors="replace")[-2000:]
            raise RuntimeError(f"{Path(args[0]).name} failed ({done.returncode}): {done.stderr.strip()[-2000:]} {log}")

    def new_database(self) -> str:
        """Create an empty database and return its DSN."""
        import psycopg
        from psycopg import sql

        name = f"agl_{uuid.uuid4().hex[:12]}"
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
        return self.dsn.rsplit("/", 1)[0] + f"/{name}"

    def new_schema(self) -> str:
        """Create an empty schema in the ``postgres`` database and return a DSN whose ``search_path`` is it.

        Cheaper than a database (no file copy): what a test that wants a fresh, empty store uses.
        """
        import psycopg
        from psycopg import sql

        name = f"agl_{uuid.uuid4().hex[:12]}"
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(name)))
        return f"{self.dsn}?options=-csearch_path%3D{name}"

    def pause(self) -> None:
        """Stop the server but keep its data (a database outage); `resume` starts it again on the same port."""
        bin_dir = find_pg_bin()
        assert bin_dir is not None and self._folder is not None, "the server is not started"
        self._check(bin_dir / "pg_ctl", "-D", str(self.data_dir), "-m", "fast", "-w", "-t", "60", "stop")

    def resume(self) -> None:
        """Start a paused server again (same data, same port); returns once it accepts connections."""
        bin_dir = find_pg_bin()
        assert bin_dir is not None and self._folder is not None, "the server is not started"
        options = " ".join(f"-c {name}={value}" for name, value in self.settings.items())
        self._check(
            bin_dir / "pg_ctl", "-D", str(self.data_dir), "-l", str(self._folder / "server.log"), "-w", "-t", "60",
            "-o", f"-c listen_addresses=127.0.0.1 -p {self.port} -c unix_socket_directories={self._folder} "
            f"-c max_connections=200 {options}", "start",
        )  # fmt: skip

    def stop(self) -> None:
        """Stop the server at once (its data is about to be deleted) and delete its folder (idempotent)."""
        folder, self._folder = self._folder, None
        if folder is None:
            return
        bin_dir = find_pg_bin()
        if bin_dir is not None and (folder / "data" / "postmaster.pid").exists():
            with contextlib.suppress(subprocess.SubprocessError, OSError):
                subprocess.run(
                    self._command(str(bin_dir / "pg_ctl"), "-D", str(folder / "data"), "-m", "immediate", "-w", "stop"),
                    capture_output=True,
                    timeout=60,
                )
        shutil.rmtree(folder, ignore_errors=True)

    def __enter__(self) -> PostgresServer:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
