"""``python -m agentlightning.runner ...`` is ``agl runner ...``: one runner process (``agl runner --help``).

Kept as a module entry point for environments without the ``agl`` script on ``PATH``; the options, the store
(``--db FILE`` or ``--store-url URL``), the signal handling (drain on SIGTERM or Ctrl-C) and the exit codes are
``agl runner``'s, because it is the same code.
"""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    """Run ``agl runner`` with ``argv`` (default: the command line); returns the exit code."""
    from agentlightning.cli import main as agl_main

    return agl_main(["runner", *(sys.argv[1:] if argv is None else argv)])


if __name__ == "__main__":
    sys.exit(main())
