"""Runner process for the calculator agent: ``agl runner`` with this folder's agent filled in.

    python examples/calc/run_agents.py --db runs/calc/store.db --workers 128
    python examples/calc/run_agents.py --store-url http://trainer-host:4747 --token T --workers 128

The same as ``agl runner --app-dir examples/calc --agent calc_agent:calc_agent ...`` (every other ``agl runner`` option
passes through). The trainer (``train.py``) starts these for you; start more on other machines against its served
store. ``--instrument langchain`` traces every LangChain/LangGraph run (the agent itself has no tracing line).
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
        "calc_agent:calc_agent",
        "--worker-mode",
        "async",
        "--instrument",
        "langchain",
    ]
    return agl(["runner", *fixed, *args])


if __name__ == "__main__":
    sys.exit(main())
