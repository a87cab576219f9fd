"""Runner process for the RAG agent: ``agl runner`` with this folder's agent filled in.

    python examples/rag/run_agents.py --db runs/rag/store.db --workers 64
    python examples/rag/run_agents.py --store-url http://trainer-host:4747 --token T --workers 64

The same as ``agl runner --app-dir examples/rag --agent rag_agent:rag_agent ...`` (every other ``agl runner``
option passes through). The trainer (``train.py``) starts these for you. The agent module turns on its own tracing
(``agentlightning_openai_agents.instrument()``); ``$RAG_CORPUS`` names another corpus file.
"""

from __future__ import annotations

import sys
from pathlib import Path

from agentlightning.cli import main as agl

HERE = Path(__file__).resolve().parent


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    fixed = ["--app-dir", str(HERE), "--agent", "rag_agent:rag_agent", "--worker-mode", "async"]
    return agl(["runner", *fixed, "--instrument", "openai_agents", *args])


if __name__ == "__main__":
    sys.exit(main())
