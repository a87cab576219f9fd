"""Runner process for the math agent: ``agl runner`` with this folder's AutoGen agent filled in.

    python examples/math/run_agents.py --db runs/math/store.db --workers 64
    python examples/math/run_agents.py --store-url http://trainer-host:4747 --workers 64   # token: $AGL_STORE_TOKEN

The same as ``agl runner --app-dir examples/math --agent math_agent:math_agent --instrument autogen ...`` (every other
``agl runner`` option passes through). ``train.py`` starts these for you. ``--instrument autogen`` is the adapter's
one line (``agentlightning_autogen.instrument()``): every AutoGen agent turn, tool call and model call is traced.
"""

from __future__ import annotations

import sys
from pathlib import Path

from agentlightning.cli import main as agl

HERE = Path(__file__).resolve().parent


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    fixed = ["--app-dir", str(HERE), "--agent", "math_agent:math_agent", "--worker-mode", "async"]
    fixed += ["--instrument", "autogen"]
    return agl(["runner", *fixed, *args])


if __name__ == "__main__":
    sys.exit(main())
