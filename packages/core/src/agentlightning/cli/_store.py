"""``agl store serve``: serve a SQLite, PostgreSQL (or in-memory) store over HTTP for runners on other machines.

With ``--db postgresql://...`` any number of these servers may serve one database (behind a load balancer or
DNS): they keep no state of their own, and every claim is decided in the database.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import socket
from typing import Any

from agentlightning.cli._options import add_log_level_argument

__all__ = [
    "add_store_arguments",
    "connect_store",
    "register",
    "serve",
    "store_location",
]

logger = logging.getLogger(__name__)

TOKEN_ENV = "AGL_STORE_TOKEN"
"""Environment variable read for the bearer token when ``--token`` is not given (without either: a new one)."""


def register(subparsers: Any) -> None:
    """Add the ``store`` command group (``agl store serve``) to the ``agl`` parser."""
    store_parser = subparsers.add_parser("store", help="the LightningStore")
    store_sub = store_parser.add_subparsers(dest="store_command", required=True)
    serve_parser = store_sub.add_parser(
        "serve",
        help="serve a store over HTTP",
        description="Serve a LightningStore over HTTP (clients: agentlightning.StoreClient).",
    )
    where = serve_parser.add_mutually_exclusive_group()
    where.add_argument(
        "--db",
        default="agentlightning.db",
        help="SQLite file (created if missing), or a PostgreSQL database: postgresql://user:password@host:port/dbname "
        "(needs agentlightning-core[postgres]; several servers may share one)",
    )
    where.add_argument("--memory", action="store_true", help="keep everything in memory (lost on exit)")
    serve_parser.add_argument("--host", default="127.0.0.1", help="address to bind (default: 127.0.0.1)")
    serve_parser.add_argument("--port", type=int, default=4747, help="port to bind (default: 4747)")
    serve_parser.add_argument(
        "--fd",
        type=int,
        default=None,
        help="serve on this inherited listening socket instead of binding --host/--port (a trainer's dashboard, "
        "started when its address is first visited)",
    )
    serve_parser.add_argument(
        "--token",
        default=None,
        help=f"bearer token clients must send (default: ${TOKEN_ENV}, else a new one, printed); required off loopback",
    )
    serve_parser.add_argument("--max-attempts", type=int, default=None, help="attempts per rollout (retry policy)")
    serve_parser.add_argument(
        "--heartbeat-timeout", type=float, default=None, help="seconds without heartbeat before an attempt is dropped"
    )
    serve_parser.add_argument("--rollout-timeout", type=float, default=None, help="seconds an attempt may run")
    serve_parser.add_argument(
        "--retry-on", default=None, help="comma-separated attempt outcomes that are retried (e.g. failed,timeout)"
    )
    serve_parser.add_argument(
        "--synchronous",
        choices=("NORMAL", "FULL"),
        default="NORMAL",
        help="SQLite fsync level: NORMAL survives a killed process, FULL also a power cut (slower)",
    )
    serve_parser.add_argument("--max-body-mb", type=float, default=32.0, help="largest request body in MiB")
    add_log_level_argument(serve_parser, "uvicorn log")
    serve_parser.add_argument("--no-ui", action="store_true", help="do not serve the browser dashboard at /ui")
    serve_parser.add_argument(
        "--access-log", action="store_true", help="log every request with the client's address (to stdout)"
    )
    serve_parser.set_defaults(func=serve, serving="agl store serve")


def add_store_arguments(parser: argparse.ArgumentParser, token_flag: str) -> None:
    """Add the store a command uses: ``--store-url URL`` (a served store) or ``--db FILE``, one required.

    Args:
        parser: The command's parser.
        token_flag: The flag of the served store's bearer token (default: ``$AGL_STORE_TOKEN``).
    """
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument(
        "--store-url",
        help="URL of a served store (`agl store serve`), e.g. http://trainer:4747; several servers of one PostgreSQL "
        "store separated by commas (http://a:4747,http://b:4747): the first until it fails, then the next",
    )
    where.add_argument("--db", help="a SQLite store file on this machine (created if missing), or postgresql://...")
    parser.add_argument(token_flag, default=None, help=f"the served store's bearer token (default: ${TOKEN_ENV})")


def connect_store(store_url: str | None, db: str, token: str | None) -> Any:
    """The store of `add_store_arguments`' options: a `StoreClient` for ``--store-url``, a `PostgresStore` for a
    ``postgresql://`` ``--db``, else a `SqliteStore`."""
    from agentlightning.store import PostgresStore, SqliteStore, StoreClient
    from agentlightning.store._postgres_schema import is_postgres_dsn

    if store_url:
        return StoreClient(store_url, token=token or os.environ.get(TOKEN_ENV) or None)
    if is_postgres_dsn(db):
        return PostgresStore(db)
    return SqliteStore(db)


def store_location(store_url: str | None, db: str) -> str:
    """Where the store of `add_store_arguments`' options is, for messages (a DSN without its password)."""
    from agentlightning.store import StoreError
    from agentlightning.store._postgres_schema import describe_dsn, is_postgres_dsn

    if store_url:
        return store_url
    if is_postgres_dsn(db):
        try:
            return "postgresql://" + describe_dsn(db)
        except (ImportError, ValueError, StoreError):
            return "a PostgreSQL database"
    return os.path.abspath(db)


def serve(args: argparse.Namespace) -> int:
    """Run the server until interrupted; returns the exit code (2 for a refused configuration)."""
    from rich.console import Console
    from rich.markup import escape

    from agentlightning._netauth import new_token
    from agentlightning.store import StoreError

    console = Console(stderr=True, soft_wrap=True)  # soft wrap: an error stays one line however long
    given: str | None = args.token or os.environ.get(TOKEN_ENV) or None
    sockets: list[socket.socket] | None = None
    if args.fd is not None:
        try:
            sockets = [_inherited_socket(args.fd)]
        except (OSError, ValueError) as exc:
            console.print(f"[red]--fd {args.fd} is no listening socket: {escape(str(exc))}[/red]")
            return 2
        args.host, args.port = sockets[0].getsockname()[:2]
    refusal = _refusal(args.host, args.port, given)
    if refusal is not None:
        console.print(f"[red]{escape(refusal)}[/red]")
        return 2
    try:
        store = _open_store(args)
    except (OSError, ValueError, ImportError, StoreError) as exc:
        console.print(f"[red]cannot open the store:[/red] {escape(str(exc))}")
        return 2
    # Always a token, even on loopback: a web page open in the user's browser can reach this port.
    token = given or new_token()
    app = _store_app(store, token, args)
    _announce(console, args, token, made=given is None)
    _serve_until_interrupted(app, store, sockets, args)
    return 0


def _refusal(host: str, port: int, token: str | None) -> str | None:
    """Why serving on ``host``:``port`` with ``token`` is refused (the one rule of every server), else ``None``."""
    from agentlightning._netauth import check_bind_token

    try:
        check_bind_token(host, token, "the store", f"--token or set ${TOKEN_ENV}")
    except ValueError as exc:
        return str(exc)
    if not 0 <= port <= 65535:
        return f"--port must be between 0 and 65535, got {port}"
    return None


def _store_app(store: Any, token: str, args: argparse.Namespace) -> Any:
    """The served store's ASGI app, with the dashboard's routes unless ``--no-ui``."""
    from agentlightning._routing import Route
    from agentlightning.store._server import create_store_app

    extra: list[Route] = []
    if not args.no_ui:
        from agentlightning.ui import ui_routes  # the dashboard imports transitions and credit: only when served

        extra = ui_routes(store)
    return create_store_app(store, token=token, max_body_bytes=int(args.max_body_mb * 1024 * 1024), extra_routes=extra)


def _announce(console: Any, args: argparse.Namespace, token: str, made: bool) -> None:
    """Print where the store is served; a token made for this run is printed, a given one never reaches the logs.

    A made token is printed because the user needs it (as with a notebook server).
    """
    where = "memory" if args.memory else store_location(None, args.db)
    host = f"[{args.host}]" if ":" in args.host else args.host
    console.print(
        f"[bold green]Agent Lightning store[/bold green] serving {where} at [bold]http://{host}:{args.port}[/bold]"
        f" (bearer token required{'; a new one was made for this run' if made else ''})"
    )
    if not args.no_ui:
        where_ui = f"http://{host}:{args.port}/ui"
        console.print(f"dashboard: [bold]{where_ui}#token={token}[/bold]" if made else f"dashboard: {where_ui}")
    if made:
        console.print(f"clients: StoreClient(url, token=...) or {TOKEN_ENV}={token}")


def _serve_until_interrupted(
    app: Any, store: Any, sockets: list[socket.socket] | None, args: argparse.Namespace
) -> None:
    """Serve ``app`` with uvicorn (on ``sockets``, else ``--host``/``--port``) until Ctrl-C; then close ``store``."""
    import uvicorn

    from agentlightning._gc import frozen_gc

    config = uvicorn.Config(
        app,
        host=args.host,
        port=args.port,
        http="httptools",
        access_log=args.access_log,
        log_level=args.log_level,
        lifespan="off",
        # No X-Forwarded-* rewriting: the store reads no client address or scheme, and uvicorn's middleware for
        # it ran on every request (a store behind a proxy is admitted by its bearer token, not by address).
        proxy_headers=False,
    )
    if args.access_log:  # uvicorn set the access logger to --log-level; the lines are INFO
        logging.getLogger("uvicorn.access").setLevel(logging.INFO)
    server = uvicorn.Server(config)
    try:
        import uvloop

        loop_factory: Any = uvloop.new_event_loop
    except ImportError:  # uvicorn[standard] brings uvloop; fall back to asyncio's loop where it is missing
        loop_factory = None
    try:
        # What the server built before serving (modules, the route table) stays out of full collections, which a
        # big span batch's thousands of short-lived objects trigger: they no longer walk the whole heap.
        with frozen_gc(), asyncio.Runner(loop_factory=loop_factory) as runner:
            runner.run(_run(server, store, sockets))
    except KeyboardInterrupt:
        pass


def _inherited_socket(fd: int) -> socket.socket:
    """The listening TCP socket of descriptor ``fd`` (its family read from the descriptor itself)."""
    sock = socket.socket(fileno=fd)
    if sock.type != socket.SOCK_STREAM or sock.family not in (socket.AF_INET, socket.AF_INET6):
        sock.detach()
        raise ValueError("not a TCP socket")
    if not sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN):
        sock.detach()
        raise ValueError("not listening")
    return sock


async def _run(server: Any, store: Any, sockets: list[socket.socket] | None = None) -> None:
    try:
        await server.serve(sockets=sockets)
    finally:
        await store.close()


def _open_store(args: argparse.Namespace) -> Any:
    from agentlightning.store import RetryPolicy

    policy_fields: dict[str, Any] = {}
    if args.max_attempts is not None:
        policy_fields["max_attempts"] = args.max_attempts
    if args.heartbeat_timeout is not None:
        policy_fields["heartbeat_timeout"] = args.heartbeat_timeout
    if args.rollout_timeout is not None:
        policy_fields["rollout_timeout"] = args.rollout_timeout
    if args.retry_on is not None:
        policy_fields["retry_on"] = frozenset(s.strip() for s in args.retry_on.split(",") if s.strip())
    kwargs: dict[str, Any] = {}
    if policy_fields:
        try:
            kwargs["retry_policy"] = RetryPolicy(**policy_fields)
        except Exception as exc:  # pydantic's ValidationError names the bad flag's field
            raise ValueError(f"invalid retry policy: {exc}") from exc
    if args.memory:
        from agentlightning.store import MemoryStore

        return MemoryStore(**kwargs)
    from agentlightning.store._postgres_schema import is_postgres_dsn

    if is_postgres_dsn(args.db):
        from agentlightning.store import PostgresStore

        return PostgresStore(args.db, **kwargs)
    from agentlightning.store import SqliteStore

    return SqliteStore(args.db, synchronous=args.synchronous, **kwargs)
