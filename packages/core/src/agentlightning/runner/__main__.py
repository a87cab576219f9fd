"""``python -m agentlightning.runner --agent module:function --db store.db``: one runner process on a SQLite store.

What ``agl train`` starts ``--runners`` times: it imports the agent (``--app-dir`` first on ``sys.path``),
instruments every installed framework adapter and runs rollouts until terminated. Only the core and the agent's own
imports are loaded (never torch).
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
from pathlib import Path
from typing import Any


def _load(spec: str, app_dir: str) -> Any:
    module_name, _, attribute = spec.partition(":")
    sys.path.insert(0, str(Path(app_dir).resolve()))
    target: Any = importlib.import_module(module_name)
    for part in attribute.split("."):
        target = getattr(target, part)
    return target


def main(argv: list[str] | None = None) -> int:
    """Run rollouts until terminated; returns the exit code."""
    parser = argparse.ArgumentParser(prog="python -m agentlightning.runner", description=__doc__)
    parser.add_argument("--agent", required=True, help="module:function")
    parser.add_argument("--db", required=True, help="SQLite store file")
    parser.add_argument("--app-dir", default=".", help="folder put first on sys.path to import --agent")
    parser.add_argument("--workers", type=int, default=32, help="concurrent rollouts")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    import agentlightning as agl
    from agentlightning.runner import as_agent

    agent = as_agent(_load(args.agent, args.app_dir))
    agl.instrument_all()
    mode = "async" if agent.is_async else "thread"
    agl.Runner(
        agent, store=agl.SqliteStore(args.db), n_workers=args.workers, worker_mode=mode, poll_interval=0.02
    ).run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
