"""``agl proxy serve``: run the LLM proxy in front of one or more inference backends."""

from __future__ import annotations

import argparse
import asyncio
import os
from typing import Any

from agentlightning.cli._options import add_log_level_argument
from agentlightning.cli._store import add_store_arguments, connect_store

__all__ = ["register", "serve"]

TOKEN_ENV = "AGL_PROXY_TOKEN"
"""Environment variable read for the agents' bearer token when ``--token`` is not given."""
ADMIN_TOKEN_ENV = "AGL_PROXY_ADMIN_TOKEN"
"""Environment variable read for the admin token when ``--admin-token`` is not given."""
RUNNER_TOKEN_ENV = "AGL_PROXY_RUNNER_TOKEN"
"""Environment variable read for the runner token when ``--runner-token`` is not given."""


def register(subparsers: Any) -> None:
    """Add the ``proxy`` command group (``agl proxy serve``) to the ``agl`` parser."""
    proxy_parser = subparsers.add_parser("proxy", help="the LLM proxy that records token ids")
    proxy_sub = proxy_parser.add_subparsers(dest="proxy_command", required=True)
    serve_parser = proxy_sub.add_parser(
        "serve",
        help="run the LLM proxy",
        description=(
            "Forward OpenAI-style calls from agents (base URL {proxy}/rollout/{rollout_id}/attempt/{attempt_id}/v1) "
            "to inference backends and record each call's token ids in the store."
        ),
    )
    add_store_arguments(serve_parser, "--store-token")
    serve_parser.add_argument(
        "--backend",
        action="append",
        required=True,
        help="OpenAI-compatible backend base URL (repeat for several; rollouts stick to one)",
    )
    serve_parser.add_argument("--host", default="127.0.0.1", help="address to bind (default: 127.0.0.1)")
    serve_parser.add_argument("--port", type=int, default=4748, help="port to bind (default: 4748)")
    serve_parser.add_argument(
        "--token",
        default=None,
        help=f"bearer token agents must send as their api_key (default: ${TOKEN_ENV}); required off loopback",
    )
    serve_parser.add_argument(
        "--admin-token",
        default=None,
        help=f"token for the /admin/* routes (default: ${ADMIN_TOKEN_ENV}); without one they are disabled",
    )
    serve_parser.add_argument(
        "--runner-token",
        default=None,
        help=(
            f"token runners register their slots with (default: ${RUNNER_TOKEN_ENV}); publish it as the LLM "
            "resource's runner_token. Without one, runners use per-rollout URLs and late calls are not refused"
        ),
    )
    serve_parser.add_argument(
        "--advertise-url",
        default=None,
        help="the URL agents reach this proxy at (behind NAT or a load balancer, or with --host 0.0.0.0)",
    )
    serve_parser.add_argument("--served-model", default=None, help="replace each request's model with this name")
    serve_parser.add_argument(
        "--record",
        choices=("sync", "background"),
        default="sync",
        help="sync: write each call before answering (default); background: batch the writes",
    )
    serve_parser.add_argument(
        "--allow-unrecorded", action="store_true", help="forward plain /v1 calls unrecorded instead of refusing them"
    )
    serve_parser.add_argument("--request-timeout", type=float, default=600.0, help="seconds per backend request")
    add_log_level_argument(serve_parser, "uvicorn log")
    serve_parser.set_defaults(func=serve, serving="agl proxy serve")


def serve(args: argparse.Namespace) -> int:
    """Run the proxy until interrupted; returns the exit code (2 for a refused configuration)."""
    from rich.console import Console

    from agentlightning._netauth import check_bind_token
    from agentlightning.store import StoreError

    console = Console(stderr=True, soft_wrap=True)  # soft wrap: an error stays one line however long
    if not 0 <= args.port <= 65535:
        console.print(f"[red]--port must be between 0 and 65535, got {args.port}[/red]")
        return 2
    admin_token = args.admin_token or os.environ.get(ADMIN_TOKEN_ENV) or None
    token = args.token or os.environ.get(TOKEN_ENV) or None
    runner_token = args.runner_token or os.environ.get(RUNNER_TOKEN_ENV) or None
    try:
        check_bind_token(args.host, token, "the LLM proxy", f"--token or set ${TOKEN_ENV}")
        if admin_token is not None:
            check_bind_token(args.host, admin_token, "the proxy's admin routes", "a longer --admin-token")
        if runner_token is not None:
            check_bind_token(args.host, runner_token, "the proxy's slot routes", "a longer --runner-token")
    except ValueError as exc:
        console.print(f"[red]{exc}[/red]")
        return 2
    try:
        asyncio.run(_run(args, (token, admin_token, runner_token), console))
    except (ValueError, StoreError) as exc:
        console.print(f"[red]{' '.join(str(exc).split())}[/red]")
        return 2
    except KeyboardInterrupt:
        pass
    return 0


async def _run(args: argparse.Namespace, tokens: tuple[str | None, str | None, str | None], console: Any) -> None:
    import uvicorn

    from agentlightning.proxy import LLMProxy

    token, admin_token, runner_token = tokens
    store = connect_store(args.store_url, args.db, args.store_token)
    proxy = LLMProxy(
        store,
        args.backend,
        token=token,
        admin_token=admin_token,
        runner_token=runner_token,
        served_model=args.served_model,
        record=args.record,
        allow_unrecorded=args.allow_unrecorded,
        request_timeout=args.request_timeout,
        host=args.host,
        port=args.port,
        advertise_url=args.advertise_url,
    )
    public = args.advertise_url or f"http://{args.host}:{args.port}"
    console.print(
        f"LLM proxy on http://{args.host}:{args.port} -> {', '.join(proxy.backends)}; agents use "
        f"{public}/rollout/<rollout_id>/attempt/<attempt_id>/v1"
        f"{' with their api_key set to the token' if token else ''}"
        f"{'' if admin_token else ' (admin routes disabled: no --admin-token)'}"
        f"{'' if runner_token else ' (runner slots disabled: no --runner-token)'}"
    )
    config = uvicorn.Config(proxy.app, host=args.host, port=args.port, log_level=args.log_level, lifespan="on")
    try:
        await uvicorn.Server(config).serve()
    finally:
        await store.close()
