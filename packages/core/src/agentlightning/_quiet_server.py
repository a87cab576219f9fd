"""`QuietServer`: a uvicorn server run inside a host program (the LLM proxy, the dashboard of a training script).

uvicorn's own server installs SIGINT / SIGTERM handlers while it serves; inside a host program those signals are
the host's (Ctrl-C stops the training script, which then stops its servers), so this one leaves them alone.
"""

from __future__ import annotations

import contextlib
from collections.abc import Generator

import uvicorn

__all__ = ["QuietServer"]


class QuietServer(uvicorn.Server):
    """A uvicorn server that leaves the host program's signal handlers alone."""

    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        """Install nothing: the host program keeps its handlers."""
        yield
