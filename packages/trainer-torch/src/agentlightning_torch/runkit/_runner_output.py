"""The output of a runner process that runs where the trainer cannot see its stderr (a Ray actor's runner).

`LineBuffer` reads the process's merged stdout and stderr in a thread, so the runner never blocks on a full pipe,
and keeps the newest lines until the trainer drains them (`RayRunnerPool.output`). Kept free of heavy imports: it
runs inside each Ray actor.
"""

from __future__ import annotations

import threading
from collections import deque
from typing import IO

__all__ = ["LineBuffer"]


class LineBuffer:
    """The lines of ``stream`` (read in a daemon thread until it ends), at most ``limit`` not yet drained.

    Args:
        stream: A binary pipe (a child's ``stdout``, with ``stderr=subprocess.STDOUT``).
        limit: Lines kept between two drains; older ones are dropped and counted.
    """

    def __init__(self, stream: IO[bytes], limit: int = 10_000) -> None:
        self._stream = stream
        self._lines: deque[str] = deque(maxlen=limit)
        self._dropped = 0
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._read, name="agl-runner-output", daemon=True)
        self._thread.start()

    def _read(self) -> None:
        try:
            for raw in iter(self._stream.readline, b""):
                line = raw.decode("utf-8", errors="replace").rstrip("\r\n")
                with self._lock:
                    if len(self._lines) == self._lines.maxlen:
                        self._dropped += 1
                    self._lines.append(line)
        except (OSError, ValueError):  # the pipe closed under us: the process is gone
            pass
        finally:
            self._stream.close()

    def drain(self) -> list[str]:
        """The lines read since the last drain (a note first if some were dropped)."""
        with self._lock:
            lines = list(self._lines)
            self._lines.clear()
            dropped, self._dropped = self._dropped, 0
        return ([f"[{dropped} earlier lines dropped]"] if dropped else []) + lines

    def join(self, timeout: float) -> None:
        """Wait until the stream has ended (the process exited and its last lines are read), at most ``timeout``."""
        self._thread.join(timeout)
