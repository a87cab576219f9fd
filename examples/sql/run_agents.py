"""Runner process for the text-to-SQL agents: ``agl runner`` with this folder's agent filled in.

    python examples/sql/run_agents.py --db runs/sql/store.db --workers 64
    python examples/sql/run_agents.py --store-url http://trainer-host:4747 --token T --workers 64

The same as ``agl runner --app-dir examples/sql --agent sql_agent:sql_agent --instrument langchain ...`` (every other
``agl runner`` option passes through). ``train.py`` starts these for you.
"""

from __future__ import annotations

import sys
from pathlib import Path

from agentlightning.cli import main as agl

HERE = Path(__file__).resolve().parent


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    fixed = [
        "--app-dir",
        str(HERE),
        "--agent",
        "sql_agent:sql_agent",
        "--worker-mode",
        "async",
        "--instrument",
        "langchain",
    ]
    return agl(["runner", *fixed, *args])


if __name__ == "__main__":
    sys.exit(main())
