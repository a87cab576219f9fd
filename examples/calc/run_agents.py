"""Runner process for the calculator agent: takes rollouts from a store and runs the LangGraph agent on them.

    python examples/calc/run_agents.py --db runs/calc/store.db --workers 128
    python examples/calc/run_agents.py --store-url http://trainer-host:4747 --token T --workers 128

The trainer (``train.py``) starts one of these for you; start more on other machines against a served store.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from agent import calc_agent

import agentlightning as agl
import agentlightning_langchain


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--db", help="SQLite store file shared with the trainer")
    where.add_argument("--store-url", help="URL of a store served by `agl store serve`")
    parser.add_argument("--token", default=os.environ.get("AGL_STORE_TOKEN"), help="bearer token of the served store")
    parser.add_argument("--workers", type=int, default=128, help="concurrent rollouts (asyncio tasks)")
    args = parser.parse_args()
    if args.workers < 1:
        parser.error("--workers must be at least 1")
    logging.basicConfig(level=logging.WARNING)
    store: agl.LightningStore = (
        agl.SqliteStore(args.db) if args.db else agl.StoreClient(args.store_url, token=args.token)
    )
    agentlightning_langchain.instrument()  # the one line that traces every LangChain/LangGraph run
    agl.Runner(calc_agent, store=store, n_workers=args.workers, worker_mode="async", poll_interval=0.02).run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
