"""`wait_until`: wait for a condition a test cannot be notified of (another process's state), bounded only by a hang."""

from __future__ import annotations

import time
from collections.abc import Callable

__all__ = ["wait_until"]


def wait_until(condition: Callable[[], bool], what: str, timeout: float = 300.0, interval: float = 0.05) -> None:
    """Poll ``condition`` until it holds.

    The test waits on the event itself: the timeout only turns a hang into a failure that names ``what`` (set it
    far above any wait a busy machine needs), and nothing is asserted about how long the wait took.

    Raises:
        AssertionError: ``condition`` did not hold within ``timeout`` seconds.
    """
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(interval)
